"""One file a Python process would ``dlopen``, judged as glibc would load it.

An extension module (or a library a package loads with ctypes, such as
torch's ``libtorch_global_deps.so``) is mapped by ``dlopen`` inside the
running interpreter: glibc's rules apply, not the kernel's, and the error
surfaces as an ``ImportError`` (or ``OSError``) at the import, not as a
failed execve. Every library the file pulls in goes through the same
loader model and page rules as a program's, within one
:class:`~grace_policy.loader.Process` so sonames already loaded are reused.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from ..budget import Budget
from ..elf import ElfError, read_elf
from ..findings import Issue
from ..layout import page_issues
from ..loader import Loading, Process
from ..node import NodeProfile, node_owns

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..cuda.stepcheck import GpuCheck

Causes = Callable[[str], tuple[str, ...]]

_LOADER_PREFIX = "error while loading shared libraries: "


def import_error(text: str, via: str) -> str:
    """A loader message as the import shows it (``via``: "ImportError")."""
    if text.startswith(_LOADER_PREFIX):
        return f"{via}: {text[len(_LOADER_PREFIX):]}"
    return text


class Judge:
    """Judges files for one step; every file and library at most once."""

    def __init__(self, process: Process, node: NodeProfile, budget: Budget, causes: Causes,
                 extra: Callable[..., list[Issue]] | None = None,
                 gpu: GpuCheck | None = None) -> None:
        self.process = process
        self.node = node
        self.budget = budget
        #: Where the files are read (the process's files) and charged.
        self.how = Loading(budget=budget, files=process.files)
        self.causes = causes
        #: More per-file rules (page size compiled into code), if present.
        self.extra = extra
        #: The step's GPUs: each file's kernels are judged for them.
        self.gpu = gpu
        self._seen: set[str] = set()

    def file(self, path: str, *, module: str = "", required: bool = True,
             deps: bool = True) -> list[Issue]:
        """Issues of ``path`` and what it loads. ``module``: the dotted name
        the file is imported as ("" for a library loaded with ctypes).
        ``required``: a file that is not ELF is a problem (an extension
        module) rather than something to pass over (a stray ``.so`` name).
        ``deps``: resolve what it needs too. A library a package loads
        itself, if and when it chooses (torchcodec tries one core per FFmpeg
        major; torch loads its CUDA parts only on GPUs), is judged for
        architecture and layout only: a missing dependency of one is no
        certain failure."""
        key = os.path.normpath(path)
        if key in self._seen:
            return []
        self._seen.add(key)
        self.budget.take_file()
        via = "ImportError" if module else "OSError"
        try:
            info = read_elf(self.process.searcher.to_host(path), budget=self.budget,
                            files=self.how.files)
        except ElfError as exc:
            if exc.not_elf and not required:
                return []
            return [Issue("elf-invalid", path,
                          f"{via}: {path}: invalid ELF header ({exc.reason})",
                          causes=self.causes(path), facts=(("detail", exc.reason),))]
        except OSError:
            return []  # unreadable or gone: the import would say so itself
        node = self.node
        if not node.runs(info):
            return [Issue(
                "py-ext-arch", path,
                f"{via}: {path}: cannot open shared object file: No such file or directory",
                causes=self.causes(path),
                facts=(("file_arch", info.machine_name), ("name", module or path)),
            )]
        issues = [self._own(i, path, via) for i in page_issues(
            path, info, node, mapped_by_kernel=False, how=self.how)]
        if self.extra is not None:
            issues += [self._own(i, path, via)
                       for i in self.extra(path, info, node, self.how)]
        if self.gpu is not None:
            issues += [self._own(i, path, via) for i in self.gpu.file(
                path, info, self.process.searcher.to_host(path))]
        if not deps:
            return issues
        tree = self.process.dlopen(path, info)
        for obj in tree.objects[1:]:
            # RUNPATH $ORIGIN/../PKG.libs gives paths with "..": one file, one finding.
            key = os.path.normpath(obj.path)
            if obj.by_name_only or key in self._seen:
                continue
            self._seen.add(key)
            self.budget.tick()
            found = page_issues(obj.path, obj.info, node, mapped_by_kernel=False, how=self.how)
            if self.extra is not None:
                found += self.extra(obj.path, obj.info, node, self.how)
            if self.gpu is not None:
                found += self.gpu.file(obj.path, obj.info,
                                       self.process.searcher.to_host(obj.path))
            issues += [self._own(i, obj.path, via) for i in found]
        for miss in tree.missing:
            self.budget.tick()
            foreign = miss.foreign
            where = foreign[0].path if foreign else miss.needed_by
            note = (" (only files for another architecture were found)" if foreign else "")
            issues.append(Issue(
                "lib-not-found", miss.needed_by,
                f"{via}: {miss.name}: cannot open shared object file: No such file or "
                f"directory{note}",
                causes=self.causes(where),
                facts=(("name", miss.name), ("needed_by", miss.needed_by),
                       ("candidates", ", ".join(f"{c.path} ({c.machine})" for c in foreign))),
            ))
        for fatal in tree.fatal:
            self.budget.tick()
            issues.append(Issue(
                "elf-invalid", fatal.path, f"{via}: {fatal.path}: {fatal.reason}",
                causes=self.causes(fatal.path),
                facts=(("name", fatal.name), ("needed_by", fatal.needed_by),
                       ("detail", fatal.reason)),
            ))
        for version in tree.versions:
            # dlerror's text; dl-open.c fails the dlopen on the first one. An
            # ld.so assertion ends the whole interpreter instead.
            self.budget.tick()
            issues.append(Issue(
                "lib-version-missing", version.needed_by,
                version.message() if version.kind == "unversioned"
                else f"{via}: {version.message()}",
                causes=self.causes(version.needed_by), facts=version.facts,
            ))
        return issues

    def _own(self, issue: Issue, path: str, via: str) -> Issue:
        facts = issue.facts
        if issue.rule.startswith("page-") and node_owns(self.node, path, self.how.files):
            # As for programs: the node's own files are built for its pages.
            facts = (*facts, ("max_severity", "info"))
        return Issue(issue.rule, issue.path, import_error(issue.predicted_error, via),
                     self.causes(path), facts)
