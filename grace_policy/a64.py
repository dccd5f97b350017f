"""The few A64 (aarch64) instructions the compiled-page rule reads.

Not a disassembler: each function recognises one instruction form from its
32-bit word and returns its operands, or None for any other word. The tests
hold every function to ``aarch64-linux-gnu-objdump`` over whole ``.text``
sections of real builds, in both directions (what objdump calls that
instruction, this module must recognise, and nothing else).

Encodings from the Arm Architecture Reference Manual (A64 base instructions).
"""

from __future__ import annotations

#: Condition codes of B.cond, by number.
CONDITIONS = ("eq", "ne", "cs", "cc", "mi", "pl", "vs", "vc",
              "hi", "ls", "ge", "lt", "gt", "le", "al", "nv")
COND_HI = 8
COND_LS = 9


def _sext(value: int, bits: int) -> int:
    return value - (1 << bits) if value & (1 << (bits - 1)) else value


def adrp(word: int, pc: int) -> tuple[int, int] | None:
    """``adrp xD, PAGE``: (D, PAGE)."""
    if word & 0x9F000000 != 0x90000000:
        return None
    imm = ((word >> 29) & 3) | (((word >> 5) & 0x7FFFF) << 2)
    return word & 31, ((pc & ~0xFFF) + (_sext(imm, 21) << 12)) & 0xFFFFFFFFFFFFFFFF


def add_imm(word: int) -> tuple[int, int, int] | None:
    """``add xD, xN, #imm`` (64-bit, unshifted, flags untouched): (D, N, imm).
    Register 31 is SP here, as in the instruction."""
    if word & 0xFFC00000 != 0x91000000:
        return None
    return word & 31, (word >> 5) & 31, (word >> 10) & 0xFFF


def cmp_imm(word: int) -> tuple[int, int] | None:
    """``cmp xN, #imm{, lsl #12}`` (``subs xzr, xN, #imm``, 64-bit): (N, value)."""
    if word & 0xFF80001F != 0xF100001F:
        return None
    imm = (word >> 10) & 0xFFF
    return (word >> 5) & 31, imm << 12 if word & (1 << 22) else imm


def b_cond(word: int, pc: int) -> tuple[int, int] | None:
    """``b.COND TARGET``: (condition number, TARGET)."""
    if word & 0xFF000010 != 0x54000000:
        return None
    return word & 15, pc + (_sext((word >> 5) & 0x7FFFF, 19) << 2)


def is_branch(word: int) -> bool:
    """Any branch, return or exception-raising instruction: a basic block ends
    after it (calls, ``bl``/``blr``, are not counted: they come back)."""
    if word & 0x7C000000 == 0x14000000:           # b, bl
        return word & 0x80000000 == 0
    if word & 0xFF000010 == 0x54000000:           # b.cond
        return True
    if word & 0x7E000000 in (0x34000000, 0x36000000):  # cbz/cbnz, tbz/tbnz
        return True
    if word & 0xFE000000 == 0xD6000000:           # br, blr, ret, eret, ...
        return (word >> 21) & 0xF != 1            # not blr (opc 0001)
    return word & 0xFF000000 == 0xD4000000        # svc, brk, hlt, ...


def sets_flags(word: int) -> bool:
    """The instruction may write NZCV (conservative: the common classes)."""
    if word & 0x1F800000 == 0x11000000 or word & 0x1F000000 == 0x0B000000:
        return bool(word & (1 << 29))             # adds/subs (imm, shifted, extended)
    if word & 0x1F800000 == 0x12000000 or word & 0x1F000000 == 0x0A000000:
        return word & 0x60000000 == 0x60000000    # ands/bics
    if word & 0x1FE00000 == 0x1A000000:
        return bool(word & (1 << 29))             # adcs/sbcs
    if word & 0x1FE00000 == 0x1A400000:
        return True                               # ccmp/ccmn
    if word & 0x5F200000 == 0x1E200000:           # scalar FP data processing
        return (word >> 10) & 0xF in (0x8, 0x1, 0x5, 0x9, 0xD)  # fcmp, fccmp
    return word & 0xFFF8F01F == 0xD500401F or word & 0xFFF00000 == 0xD5100000  # msr
