"""``dataclass``, ``field`` and ``replace`` without importing :mod:`dataclasses`.

Why: the plugin starts a fresh interpreter in slurmstepd for every step, and
``import dataclasses`` pulls in ``inspect`` (with ``ast``, ``dis``, ``enum``,
``re``, ``tokenize`` ...): ~15-20 ms of a clean step that otherwise costs a
few ms of real work (docs/PERFORMANCE.md). The records of the core only need
a small part of it: an ``__init__`` with defaults and default factories,
``__repr__``, ``__eq__``, ``__hash__`` when frozen, ``compare=False``, and
``replace``. That is what this module generates, one ``exec`` per class for
``__init__`` (instances are created per ELF file and segment, so a generic
``*args`` init would cost more than it saves) and plain closures otherwise.

Compatibility: :func:`dataclasses.is_dataclass`, ``fields``, ``asdict`` and
``replace`` still work on these classes. ``__dataclass_fields__`` is a lazy
class attribute that imports :mod:`dataclasses` and builds real ``Field``
objects on first access, so only code that asks (tests, the CLI) pays.

Type checkers see the real :mod:`dataclasses` (``TYPE_CHECKING`` branch).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from dataclasses import FrozenInstanceError, dataclass, field, replace
else:

    class _Missing:
        __slots__ = ()

        def __repr__(self) -> str:
            return "MISSING"

    _MISSING = _Missing()

    class FrozenInstanceError(AttributeError):
        """Assignment to a field of a frozen record (as dataclasses')."""

    class _Field:
        __slots__ = ("compare", "default", "default_factory", "name", "type")

        def __init__(self, default: object, default_factory: object, compare: bool) -> None:
            if default is not _MISSING and default_factory is not _MISSING:
                raise ValueError("cannot specify both default and default_factory")
            self.default = default
            self.default_factory = default_factory
            self.compare = compare
            self.name = ""
            self.type = ""

    def field(*, default: object = _MISSING, default_factory: object = _MISSING,
              compare: bool = True) -> object:
        return _Field(default, default_factory, compare)

    class _LazyDataclassFields:
        """``cls.__dataclass_fields__`` built from real dataclasses.Field
        objects on first access, then stored on the class."""

        def __get__(self, obj: object, owner: type) -> dict[str, object]:
            import dataclasses

            out: dict[str, object] = {}
            for f in owner.__record_fields__:
                kw: dict[str, object] = {"compare": f.compare}
                if f.default is not _MISSING:
                    kw["default"] = f.default
                if f.default_factory is not _MISSING:
                    kw["default_factory"] = f.default_factory
                real = dataclasses.field(**kw)
                real.name = f.name
                real.type = f.type
                real._field_type = dataclasses._FIELD  # what @dataclass sets
                out[f.name] = real
            type.__setattr__(owner, "__dataclass_fields__", out)
            return out

    def _make_init(cls: type, fields: list[_Field], frozen: bool) -> object:
        params, body = [], []
        ns: dict[str, object] = {"_MISSING": _MISSING}
        for f in fields:
            if f.default_factory is not _MISSING:
                ns[f"_fac_{f.name}"] = f.default_factory
                params.append(f"{f.name}=_MISSING")
                body.append(f"    if {f.name} is _MISSING: {f.name} = _fac_{f.name}()")
            elif f.default is not _MISSING:
                ns[f"_dflt_{f.name}"] = f.default
                params.append(f"{f.name}=_dflt_{f.name}")
            else:
                params.append(f.name)
        if frozen:
            body.append("    _gp_d = self.__dict__")
            body.extend(f"    _gp_d[{f.name!r}] = {f.name}" for f in fields)
        else:
            body.extend(f"    self.{f.name} = {f.name}" for f in fields)
        if hasattr(cls, "__post_init__"):
            body.append("    self.__post_init__()")
        src = f"def __init__(self, {', '.join(params)}):\n" + "\n".join(body or ["    pass"])
        exec(src, ns)  # our own text, built from the class's identifiers
        init = ns["__init__"]
        init.__qualname__ = f"{cls.__qualname__}.__init__"
        return init

    def _process(cls: type, frozen: bool) -> type:
        fields: dict[str, _Field] = {}
        for base in reversed(cls.__mro__[1:]):
            for f in base.__dict__.get("__record_fields__", ()):
                fields[f.name] = f
        own = cls.__dict__.get("__annotations__", {})  # noqa: RUF063 (no typing import)
        for name, annotation in own.items():
            if isinstance(annotation, str) and annotation.startswith(
                    ("ClassVar", "typing.ClassVar")):
                continue
            value = cls.__dict__.get(name, _MISSING)
            f = value if isinstance(value, _Field) else _Field(value, _MISSING, True)
            f.name, f.type = name, annotation
            if f.default is _MISSING:
                if name in cls.__dict__:
                    delattr(cls, name)
            else:
                setattr(cls, name, f.default)
            fields[name] = f
        flist = list(fields.values())
        names = tuple(f.name for f in flist)
        compared = tuple(f.name for f in flist if f.compare)
        cls.__record_fields__ = tuple(flist)
        cls.__dataclass_fields__ = _LazyDataclassFields()
        cls.__match_args__ = names
        cls.__init__ = _make_init(cls, flist, frozen)

        def __repr__(self: object) -> str:
            inner = ", ".join(f"{n}={getattr(self, n)!r}" for n in names)
            return f"{self.__class__.__qualname__}({inner})"

        def __eq__(self: object, other: object) -> bool:
            if other.__class__ is self.__class__:
                return (tuple(getattr(self, n) for n in compared)
                        == tuple(getattr(other, n) for n in compared))
            return NotImplemented

        if "__repr__" not in cls.__dict__:
            cls.__repr__ = __repr__
        if "__eq__" not in cls.__dict__:
            cls.__eq__ = __eq__
        if frozen:
            def __hash__(self: object) -> int:
                return hash(tuple(getattr(self, n) for n in compared))

            def __setattr__(self: object, name: str, value: object) -> None:
                raise FrozenInstanceError(f"cannot assign to field {name!r}")

            def __delattr__(self: object, name: str) -> None:
                raise FrozenInstanceError(f"cannot delete field {name!r}")

            if "__hash__" not in cls.__dict__ or cls.__dict__["__hash__"] is None:
                cls.__hash__ = __hash__
            cls.__setattr__ = __setattr__
            cls.__delattr__ = __delattr__
        elif "__hash__" not in cls.__dict__:
            cls.__hash__ = None  # eq without frozen: unhashable, as dataclasses does
        return cls

    def dataclass(cls: type | None = None, /, *, frozen: bool = False) -> object:
        """Drop-in for ``@dataclass`` / ``@dataclass(frozen=True)``."""
        def wrap(c: type) -> type:
            return _process(c, frozen)

        return wrap if cls is None else wrap(cls)

    def replace(obj: object, /, **changes: object) -> object:
        """Drop-in for :func:`dataclasses.replace`."""
        for f in obj.__class__.__record_fields__:
            if f.name not in changes:
                changes[f.name] = getattr(obj, f.name)
        return obj.__class__(**changes)
