"""What compiled GPU code costs, read from ptxas's ``-v`` log and the PTX: registers, spills, and
every global load and store by width and by the array it reads or writes. Shared by the reports
on the Triton kernel (tests/triton_report.py) and the CuPy kernel (tests/cuda_report.py); it
imports no GPU library.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

__all__ = ["accesses", "bits", "cells", "entries", "ptxas_figures", "widths"]

_INSTRUCTION = re.compile(r"(?:@!?%\w+\s+)?([a-z][\w.:]*)\s*(.*)")
_NO_RESULT = ("st.", "bra", "ret", "bar.", "call", "red.", "prefetch")


def ptxas_figures(log: str) -> dict[str, Any]:
    """Registers per thread of the entry function, and the spills and stack frames of all its
    functions (libdevice's slow path of cos and sin is one of its own), from ptxas's ``-v`` log
    of one entry."""
    used = re.findall(r"Used (\d+) registers", log)
    frames = re.findall(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log)
    assert used, log
    assert frames, log
    return {
        "registers": int(used[0]),
        "spill_stores": sum(int(f[1]) for f in frames),
        "spill_loads": sum(int(f[2]) for f in frames),
        "stack_bytes": sum(int(f[0]) for f in frames),
    }


def entries(text: str, start: str) -> dict[str, str]:
    """A multi-kernel PTX file or ptxas log split per entry function: each entry's name and its
    part, the text before the first entry (the PTX's global declarations) leading each part.
    ``start``: a pattern whose group 1 is an entry's name where its part begins."""
    found = list(re.finditer(start, text, flags=re.MULTILINE))
    head = text[: found[0].start()] if found else text
    ends = [m.start() for m in found[1:]] + [len(text)]
    return {m[1]: head + text[m.start() : end] for m, end in zip(found, ends, strict=True)}


def accesses(ptx: str, params: list[str], arrays: dict[str, str]) -> dict[str, dict[str, int]]:
    """Each global load and store instruction of the PTX, counted by the array it reads or
    writes and by instruction: ``{"x load": {"ld.global.v4.b32": 4}, ...}``. ``params``: the
    entry's parameters in order; ``arrays``: the array each pointer parameter is. The array is
    the pointer argument its address is computed from, traced back through the registers that
    define it (PTX's line info, ``.loc``, names the wrong lines once LLVM has moved code), or
    the global symbol (libdevice's tables for cos and sin)."""
    symbols = set(re.findall(r"^\.global\s.*?(\w+)\[", ptx, flags=re.MULTILINE))
    found: dict[str, Counter[str]] = {}
    defs: dict[str, set[str]] = {}  # register -> the registers, params and symbols it is made of
    for line in ptx.splitlines():
        text = line.split("//")[0].strip().rstrip(";").strip()
        if re.search(r"\.(entry|func)\s", text):
            defs = {}  # a function's registers are its own
        instruction = _INSTRUCTION.fullmatch(text)
        if text.startswith((".", "{", "}", "$")) or not instruction:
            continue
        op, operands = instruction[1], instruction[2]
        address = re.search(r"\[([^\]]*)\]", operands)
        if re.match(r"(ld|st)\.global\.", op) and address:
            roots = _roots(address[1], defs, symbols)
            named = {_array(r, params, arrays) for r in roots}
            kind = "+".join(sorted(a for a in named if a)) or "?"
            found.setdefault(f"{kind} {'load' if op.startswith('ld') else 'store'}", Counter())[op] += 1
        if op.startswith(_NO_RESULT):
            continue
        result, _, rest = operands.partition("}") if operands.startswith("{") else operands.partition(",")
        if op.startswith("ld.param"):  # a kernel's argument (a function's, libdevice's, is a value)
            param = re.search(r"\w_param_(\d+)", rest)
            sources = {f"param:{param[1]}"} if param else set()
        elif op.startswith("ld."):  # read from memory: not traced further
            sources = set()
        else:
            sources = set(re.findall(r"%\w+", rest)) | {
                f"symbol:{t}" for t in re.findall(r"\w+", rest) if t in symbols
            }
        for register in re.findall(r"%\w+", result):
            defs.setdefault(register, set()).update(sources)
    return {kind: dict(sorted(counts.items())) for kind, counts in sorted(found.items())}


def _array(root: str, params: list[str], arrays: dict[str, str]) -> str:
    """The array a root of an address is: a pointer parameter's, a global symbol's name, or ""
    (an integer parameter, an offset)."""
    if not root.isdigit():
        return root
    return arrays.get(params[int(root)], "") if int(root) < len(params) else ""


def _roots(address: str, defs: dict[str, set[str]], symbols: set[str]) -> set[str]:
    """The kernel's params (their indices) and the global symbols an address is made of."""
    roots = {t for t in re.findall(r"\w+", address) if t in symbols}
    todo, seen = re.findall(r"%\w+", address), set()
    while todo:
        register = todo.pop()
        if register not in seen:
            seen.add(register)
            for source in defs.get(register, ()):
                if ":" in source:  # a param or a symbol
                    roots.add(source.split(":", 1)[1])
                else:
                    todo.append(source)
    return roots


def bits(instruction: str) -> int:
    """The width of one access in bits: ``ld.global.v4.b32`` 128, ``ld.global.nc.b16`` 16."""
    parts = instruction.split(".")
    vector = next((int(p[1:]) for p in parts if re.fullmatch(r"v\d+", p)), 1)
    size = next(int(p[1:]) for p in reversed(parts) if re.fullmatch(r"[bsuf]\d+", p))
    return vector * size


def widths(found: dict[str, dict[str, int]]) -> dict[str, dict[int, int]]:
    """:func:`accesses`' counts by access width in bits: ``{"x load": {128: 4}, ...}``."""
    by_width: dict[str, Counter[int]] = {}
    for kind, counts in found.items():
        for instruction, n in counts.items():
            by_width.setdefault(kind, Counter())[bits(instruction)] += n
    return {kind: dict(sorted(c.items())) for kind, c in by_width.items()}


def cells(kernel: dict[str, Any]) -> str:
    """A kernel's figures as a table row's last cells: registers, spills, stack, accesses by width."""
    shown = "; ".join(
        f"{kind} " + ", ".join(f"{b}x{n}" for b, n in counts.items())
        for kind, counts in kernel["widths"].items()
    )
    spills = f"{kernel['spill_stores']}/{kernel['spill_loads']}"
    return f"{kernel['registers']} | {spills} | {kernel['stack_bytes']} | {shown}"
