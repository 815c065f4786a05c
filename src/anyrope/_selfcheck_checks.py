"""The self-check's checks: an oracle in plain Python, and :class:`anyrope.RoPE` held to it.

Results are compared with an oracle written in plain Python (``math`` only), so the check does
not lean on NumPy or on anyrope's own reference code. A check runs on a :class:`Target`, one
device of one library (``_selfcheck_probes`` finds them), and yields report rows.
"""

from __future__ import annotations

import contextlib
import math
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ._compat import array_namespace
from ._layout import to_layout
from ._rope import RoPE

Nested = list[Any]  # nested Python lists of floats, shape SHAPE
Status = Literal["ok", "FAIL", "skipped"]

#: (batch, heads, seq, head_dim) of the test input; small, so every backend answers in milliseconds.
SHAPE = (2, 3, 5, 8)
BASE = 10000.0
OFFSET = 5
PARTIAL = 4  # the partial-rotary case rotates half of each head
# Absolute, for inputs in [-1, 1] and outputs below sqrt(2): float32 and float64 round once; a
# 16-bit result and the oracle's, each rounded to the dtype, differ by up to two of its steps
# near sqrt(2) (float16: 2**-10 each; bfloat16: 2**-7 each, its inputs rounded too).
TOLERANCE = {"float32": 1e-5, "float64": 1e-12, "float16": 2.0**-9, "bfloat16": 2.0**-5}
CHECKS = ("oracle, half", "oracle, interleaved", "layout equivalence")


@dataclass(frozen=True)
class Target:
    """One device of one library: how to make arrays there, and which dtypes it can do."""

    device: str
    make: Callable[[Nested, str], Any]  # (nested lists, dtype name) -> array on this device
    unsupported: dict[str, str] = field(default_factory=dict)  # dtype name -> why not
    scope: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext


@dataclass(frozen=True)
class Row:
    """One line of the report."""

    backend: str
    version: str
    device: str
    dtype: str
    check: str
    status: Status
    detail: str = ""

    @property
    def result(self) -> str:
        return f"{self.status} ({self.detail})" if self.detail else self.status


# --- the oracle -------------------------------------------------------------------------------


def sample(shape: Sequence[int] = SHAPE, seed: int = 0) -> Nested:
    """Fixed pseudo-random input as nested lists.

    Values are multiples of 1/1024 in [-1, 1], exact in float32, so the oracle sees the very
    numbers the backend holds whatever the dtype.
    """
    rng = random.Random(seed)

    def build(dims: Sequence[int]) -> Nested:
        if len(dims) == 1:
            return [rng.randint(-1024, 1024) / 1024 for _ in range(dims[0])]
        return [build(dims[1:]) for _ in range(dims[0])]

    return build(shape)


def rope_oracle(x: Nested, *, rotary_dim: int, layout: str, offset: int = 0, base: float = BASE) -> Nested:
    """RoPE of a ``(batch, heads, seq, head_dim)`` nested list, straight from the definition.

    Pair i turns by ``p * base ** (-2i / rotary_dim)`` at position ``p = offset + s``; "half" pairs
    features (i, i + r/2), "interleaved" pairs (2i, 2i + 1); (a, b) -> (a cos - b sin, b cos + a sin).
    Features from ``rotary_dim`` on are copied unchanged.
    """
    half = rotary_dim // 2
    pairs = [(i, i + half) if layout == "half" else (2 * i, 2 * i + 1) for i in range(half)]
    theta = [base ** (-2 * i / rotary_dim) for i in range(half)]
    out: Nested = []
    for batch in x:
        out.append([])
        for head in batch:
            out[-1].append([])
            for s, vector in enumerate(head):
                rotated = list(vector)
                for (ia, ib), t in zip(pairs, theta, strict=True):
                    angle = (offset + s) * t
                    c, sn = math.cos(angle), math.sin(angle)
                    a, b = vector[ia], vector[ib]
                    rotated[ia], rotated[ib] = a * c - b * sn, b * c + a * sn
                out[-1][-1].append(rotated)
    return out


# --- the checks -------------------------------------------------------------------------------

Cases = list[tuple[int, int]]  # (rotary_dim, offset)
CASES: Cases = [(SHAPE[-1], 0), (PARTIAL, 0), (SHAPE[-1], OFFSET), (PARTIAL, OFFSET)]


def _describe(rotary_dim: int, offset: int) -> str:
    return f"rotary_dim={rotary_dim}, offset={offset}"


def max_abs_diff(a: Any, b: Any) -> float:
    """Largest ``|a - b|``, computed by the arrays' own library; inf when the shapes differ."""
    if tuple(a.shape) != tuple(b.shape):
        return math.inf
    xp = array_namespace(a=a, b=b)
    if a.dtype != xp.float64:  # 16-bit differences in float32: exact, and every library has it
        a, b = xp.astype(a, xp.float32), xp.astype(b, xp.float32)
    return float(xp.max(xp.abs(a - b)))


def check_oracle(make: Callable[[Nested, str], Any], dtype: str, layout: str) -> tuple[float, str]:
    """Worst error of :class:`anyrope.RoPE` against :func:`rope_oracle`, and the case it occurred in."""
    data = sample()
    x = make(data, dtype)
    worst = (0.0, "")
    for rotary_dim, offset in CASES:
        rope = RoPE(SHAPE[-1], base=BASE, rotary_dim=rotary_dim, layout=layout)
        out = rope(x, offset=offset)
        if out.dtype != x.dtype:
            return math.inf, f"dtype {x.dtype} came back as {out.dtype}, {_describe(rotary_dim, offset)}"
        expected = make(rope_oracle(data, rotary_dim=rotary_dim, layout=layout, offset=offset), dtype)
        error = max_abs_diff(out, expected)
        if math.isnan(error):  # NaN compares False with everything: report it at once
            return error, _describe(rotary_dim, offset)
        if error > worst[0]:
            worst = (error, _describe(rotary_dim, offset))
    return worst


def check_layouts(make: Callable[[Nested, str], Any], dtype: str) -> tuple[float, str]:
    """Worst gap between rotating in "half" then permuting, and permuting then rotating in "interleaved"."""
    x = make(sample(), dtype)
    worst = (0.0, "")
    for rotary_dim, offset in CASES:
        half = RoPE(SHAPE[-1], base=BASE, rotary_dim=rotary_dim, layout="half")
        inter = RoPE(SHAPE[-1], base=BASE, rotary_dim=rotary_dim, layout="interleaved")
        left = to_layout(half(x, offset=offset), "half", "interleaved", rotary_dim=rotary_dim)
        right = inter(to_layout(x, "half", "interleaved", rotary_dim=rotary_dim), offset=offset)
        error = max_abs_diff(left, right)
        if math.isnan(error):
            return error, _describe(rotary_dim, offset)
        if error > worst[0]:
            worst = (error, _describe(rotary_dim, offset))
    return worst


def error_text(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    return text if len(text) <= 160 else text[:157] + "..."


def check_target(name: str, version: str, target: Target) -> Iterator[Row]:
    """Every check on every dtype of one device, as report rows."""
    for dtype, tolerance in TOLERANCE.items():
        if dtype in target.unsupported:
            yield Row(name, version, target.device, dtype, "all", "skipped", target.unsupported[dtype])
            continue
        for check in CHECKS:
            try:
                with target.scope():
                    if check == "layout equivalence":
                        error, case = check_layouts(target.make, dtype)
                    else:
                        error, case = check_oracle(target.make, dtype, check.removeprefix("oracle, "))
            except Exception as exc:  # noqa: BLE001 - a backend bug is a result to report, not a crash
                yield Row(name, version, target.device, dtype, check, "FAIL", error_text(exc))
                continue
            if error <= tolerance:
                yield Row(name, version, target.device, dtype, check, "ok")
            else:
                yield Row(
                    name, version, target.device, dtype, check, "FAIL", f"max error {error:.3g} at {case}"
                )
