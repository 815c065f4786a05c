"""Figures of RoPE's behaviour, drawn from the library's own numbers (needs matplotlib).

Each function returns a matplotlib ``Figure``; the documentation builds its plots
with them, so every figure there is what this code computes. ``python -m anyrope`` does not
need matplotlib; ``pip install matplotlib`` (or the ``docs`` dependency group) brings it.

Examples
--------
>>> from anyrope import plots
>>> figure = plots.wrap_around()                      # doctest: +SKIP
>>> figure.savefig("wrap.png")                        # doctest: +SKIP
"""

from __future__ import annotations

import importlib
import math
from typing import Any

from . import analysis, scaling
from ._packed import packed_positions
from ._rope import RoPE

__all__ = [
    "ROPE_CONFIG",
    "axial",
    "decay",
    "frequencies",
    "layouts",
    "llama3_bands",
    "methods",
    "mrope_sections",
    "packed_layout",
    "wrap_around",
    "yarn_ramp",
]

#: The model every scaling figure uses: Llama 3.1 8B's head (128 dims, base 500000, trained on
#: 8192 positions), stretched 8 times.
ROPE_CONFIG = {"head_dim": 128, "base": 500000.0, "original": 8192, "factor": 8.0}


def _pyplot() -> Any:
    try:
        matplotlib = importlib.import_module("matplotlib")
    except ImportError as error:
        raise ImportError("anyrope.plots needs matplotlib: pip install matplotlib") from error
    matplotlib.use("Agg", force=False)  # files, not windows: also works with no display
    return importlib.import_module("matplotlib.pyplot")


def methods() -> dict[str, scaling.Scaling]:
    """Every scaling method, configured for :data:`ROPE_CONFIG`'s model."""
    original, factor, dim = ROPE_CONFIG["original"], ROPE_CONFIG["factor"], ROPE_CONFIG["head_dim"]
    pairs = int(dim) // 2
    # LongRoPE's factors are learned per model; a smooth 1 -> factor curve stands in for them.
    long_factor = [1.0 + (factor - 1.0) * (i / (pairs - 1)) ** 2 for i in range(pairs)]
    return {
        "none": scaling.Scaling(),
        "linear": scaling.Linear(factor),
        "NTK-aware": scaling.NTKAware(factor),
        "dynamic NTK (at 8x)": scaling.DynamicNTK(factor, int(original)),
        "YaRN": scaling.YaRN(factor, int(original)),
        "Llama 3": scaling.Llama3(factor, 1.0, 4.0, int(original)),
        "LongRoPE (long)": scaling.LongRoPE([1.0] * pairs, long_factor, int(original)),
        "max-length-aware": scaling.MaxLengthAware(int(original * factor)),
        "proportional (half the pairs)": scaling.Proportional(0.5),
    }


def _rope(method: scaling.Scaling) -> RoPE:
    return RoPE(
        int(ROPE_CONFIG["head_dim"]),
        base=ROPE_CONFIG["base"],
        scaling=method,
        max_position=int(ROPE_CONFIG["original"] * ROPE_CONFIG["factor"]),
    )


def frequencies() -> Any:
    """Each pair's wavelength (positions per turn) under every scaling method, one model."""
    plt = _pyplot()
    figure, ax = plt.subplots(figsize=(7.5, 4.5), layout="constrained")
    longest = int(ROPE_CONFIG["original"] * ROPE_CONFIG["factor"])
    for name, method in methods().items():
        rope = _rope(method)
        inv_freq = rope.inv_freq_at(longest)
        waves = [2 * math.pi / t if t > 0 else math.inf for t in inv_freq]
        ax.plot(range(len(waves)), waves, label=name, linewidth=1.6 if name == "none" else 1.1)
    ax.axhline(ROPE_CONFIG["original"], color="grey", linestyle=":", linewidth=1)
    ax.text(0, ROPE_CONFIG["original"] * 1.3, "trained context", color="grey", fontsize=8)
    ax.axhline(longest, color="grey", linestyle="--", linewidth=1)
    ax.text(0, longest * 1.3, "target context (8x)", color="grey", fontsize=8)
    ax.set_yscale("log")
    ax.set_xlabel("pair index i (fast pairs on the left)")
    ax.set_ylabel("wavelength 2*pi / theta_i (positions)")
    ax.set_title("Per-pair wavelength, head_dim 128, base 500000, 8192 -> 65536 positions", fontsize=10)
    ax.text(
        len(inv_freq) - 1,
        ROPE_CONFIG["original"] / 4,
        "pairs that do not turn (proportional)\nhave no wavelength",
        ha="right",
        fontsize=7,
        color="grey",
    )
    ax.legend(fontsize=8, ncol=2)
    return figure


def yarn_ramp() -> Any:
    """YaRN's per-pair blend between keeping a frequency (0) and interpolating it (1)."""
    plt = _pyplot()
    yarn = scaling.YaRN(ROPE_CONFIG["factor"], int(ROPE_CONFIG["original"]))
    dim, base = int(ROPE_CONFIG["head_dim"]), float(ROPE_CONFIG["base"])
    ramp = yarn.ramp(dim, base)
    turns = [ROPE_CONFIG["original"] * t / (2 * math.pi) for t in scaling.plain_frequencies(dim, base)]
    figure, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6), layout="constrained")
    left.step(range(len(ramp)), ramp, where="mid")
    left.set_xlabel("pair index i")
    left.set_ylabel("ramp r_i: 0 keep, 1 divide by factor")
    left.set_title("YaRN's ramp over the pairs", fontsize=10)
    right.semilogx(turns, [1 - r + r / yarn.factor for r in ramp], marker=".", linestyle="none")
    for beta, label in ((yarn.beta_fast, "beta_fast"), (yarn.beta_slow, "beta_slow")):
        right.axvline(beta, color="grey", linestyle=":")
        right.text(beta, 0.5, f" {label} = {beta:g}", fontsize=8, color="grey")
    right.invert_xaxis()
    right.set_xlabel("turns over the original 8192 positions")
    right.set_ylabel("new / old frequency")
    right.set_title(f"attention factor {yarn.attention():.4f}", fontsize=10)
    return figure


def llama3_bands() -> Any:
    """Llama 3.1's three bands: wavelengths kept, blended, or divided by the factor."""
    plt = _pyplot()
    method = scaling.Llama3(ROPE_CONFIG["factor"], 1.0, 4.0, int(ROPE_CONFIG["original"]))
    dim, base = int(ROPE_CONFIG["head_dim"]), float(ROPE_CONFIG["base"])
    plain = scaling.plain_frequencies(dim, base)
    scaled, _ = method.frequencies(dim, base)
    waves = [2 * math.pi / t for t in plain]
    figure, ax = plt.subplots(figsize=(7, 3.6), layout="constrained")
    ax.semilogx(waves, [old / new for old, new in zip(plain, scaled, strict=True)], marker=".")
    high = method.original_max_position / method.high_freq_factor
    low = method.original_max_position / method.low_freq_factor
    ax.axvspan(min(waves), high, color="tab:green", alpha=0.12, label="kept")
    ax.axvspan(high, low, color="tab:orange", alpha=0.12, label="blended")
    ax.axvspan(low, max(waves), color="tab:red", alpha=0.12, label="divided by factor")
    ax.set_xlabel("original wavelength (positions)")
    ax.set_ylabel("how much slower the pair turns")
    ax.set_title("Llama 3 scaling: factor 8, low_freq_factor 1, high_freq_factor 4", fontsize=10)
    ax.legend(fontsize=8)
    return figure


def decay(max_distance: int = 2000) -> Any:
    """RoFormer's long-term decay bound against relative distance, for two bases."""
    plt = _pyplot()
    distances = list(range(0, max_distance + 1, 2))
    figure, ax = plt.subplots(figsize=(7, 3.6), layout="constrained")
    for base in (10000.0, 500000.0):
        bound = analysis.decay_bound(RoPE(128, base=base), distances)
        ax.plot(distances, bound, linewidth=1, label=f"head_dim 128, base {base:g}")
    ax.set_xlabel("relative distance m")
    ax.set_ylabel("bound (1/h) sum_j |S_j(m)|")
    ax.set_title("Long-term decay: the bound on |q . k| falls, on average, with distance", fontsize=10)
    ax.legend(fontsize=8)
    return figure


def wrap_around(max_distance: int = 50, max_position: int = 2048) -> Any:
    """He and Xu's two figures (2023): angle difference mod 2*pi against distance for the first
    pair, with theta_0 = 1 and with the maximum length folded in (:class:`~anyrope.scaling.MaxLengthAware`)."""
    plt = _pyplot()
    aware = RoPE(2, base=10000.0, scaling=scaling.MaxLengthAware(max_position)).inv_freq[0]
    figure, axes = plt.subplots(1, 2, figsize=(9, 3.4), layout="constrained", sharey=True)
    for ax, theta, distances, title in (
        (axes[0], 1.0, range(1, max_distance + 1), "theta_0 = 1: distance 7 looks closer than 6"),
        (axes[1], aware, range(1, max_position + 1), f"max-length-aware: monotonic up to {max_position}"),
    ):
        angles = [analysis.angle_difference(m, theta) for m in distances]
        ax.plot(list(distances), angles, marker="." if len(distances) <= 100 else None, linewidth=0.8)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("distance j - i")
    axes[0].set_ylabel("angle difference mod 2*pi (rad)")
    axes[0].annotate(
        "6 rad", (6, analysis.angle_difference(6, 1.0)), textcoords="offset points", xytext=(6, 4)
    )
    axes[0].annotate(
        "0.7168 rad", (7, analysis.angle_difference(7, 1.0)), textcoords="offset points", xytext=(6, -4)
    )
    return figure


def layouts(head_dim: int = 8) -> Any:
    """Which features pair up (turn together) in the interleaved and the half layout."""
    plt = _pyplot()
    pairs = head_dim // 2
    colours = plt.get_cmap("tab10")
    figure, axes = plt.subplots(2, 1, figsize=(7, 2.8), layout="constrained")
    for ax, layout in zip(axes, ("interleaved", "half"), strict=True):
        for feature in range(head_dim):
            pair = feature // 2 if layout == "interleaved" else feature % pairs
            ax.add_patch(plt.Rectangle((feature, 0), 0.92, 0.8, color=colours(pair), alpha=0.75))
            ax.text(feature + 0.46, 0.4, f"x{feature}", ha="center", va="center", fontsize=9)
            ax.text(feature + 0.46, -0.25, f"pair {pair}", ha="center", va="center", fontsize=7)
        for pair in range(pairs):
            a, b = (2 * pair, 2 * pair + 1) if layout == "interleaved" else (pair, pair + pairs)
            ax.annotate(
                "", (b + 0.46, 0.85), (a + 0.46, 0.85),
                arrowprops={"arrowstyle": "<->", "color": colours(pair), "connectionstyle": "arc3,rad=-0.3"},
            )  # fmt: skip
        ax.set_xlim(-0.2, head_dim + 0.2)
        ax.set_ylim(-0.5, 1.6)
        ax.axis("off")
        name = "interleaved: (0,1), (2,3), ..." if layout == "interleaved" else "half: (i, i + d/2)"
        ax.set_title(name, fontsize=10)
    return figure


def mrope_sections(head_dim: int = 128) -> Any:
    """Which position stream each frequency pair follows: Qwen2-VL's contiguous sections,
    Qwen3-VL's interleaved streams, ERNIE 4.5-VL's alternating height and width before time, and
    NeoMME's alternating rows and columns, each read from the model family's config by
    :meth:`anyrope.RoPE.from_hf_config` (its :attr:`~anyrope.RoPE.pair_streams`)."""
    plt = _pyplot()
    models: list[tuple[str, dict[str, Any]]] = [
        ("Qwen2-VL: contiguous mrope_section [16, 24, 24]", {"model_type": "qwen2_vl_text"}),
        ("Qwen3-VL: interleaved, mrope_section [24, 20, 20]", {"model_type": "qwen3_vl_text"}),
        ("ERNIE 4.5-VL: height and width alternate, then time", {"model_type": "ernie4_5_vl_moe_text"}),
        (
            "NeoMME: rows and columns alternate",
            {"model_type": "neomme", "rope_parameters": {"rope_theta": 1e4}},
        ),
    ]
    colours = plt.get_cmap("tab10")
    figure, axes = plt.subplots(len(models), 1, figsize=(8, 4.4), layout="constrained")
    for ax, (title, config) in zip(axes, models, strict=True):
        rope = RoPE.from_hf_config({"head_dim": head_dim, **config})
        for pair, stream in enumerate(rope.pair_streams):
            ax.add_patch(plt.Rectangle((pair, 0), 0.9, 1, color=colours(stream), alpha=0.8))
        ax.set_xlim(0, len(rope.pair_streams))
        ax.set_ylim(0, 1)
        ax.set_yticks([])
        ax.set_title(title, fontsize=9, loc="left")
        ax.set_xlabel("frequency pair (0: fastest)" if ax is axes[-1] else "", fontsize=8)
        ax.tick_params(labelsize=7)
    names = ("time / rows", "height / columns", "width")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours(s), alpha=0.8) for s in range(3)]
    figure.legend(handles, names, loc="outside right center", fontsize=8, title="stream", title_fontsize=8)
    return figure


def packed_layout(lengths: tuple[int, ...] = (5, 3, 0, 6), padding: int = 2) -> Any:
    """A packed batch: sequences end to end along one token axis, ``cu_seqlens`` at their
    boundaries, and the position :func:`anyrope.packed_positions` gives each token."""
    import numpy as np

    plt = _pyplot()
    cu_seqlens = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    total = int(cu_seqlens[-1]) + padding
    offsets = np.array([0, 7, 0, 2][: len(lengths)], dtype=np.int64)
    positions = packed_positions(cu_seqlens, total, offsets=offsets)
    sequence = np.searchsorted(cu_seqlens[1:], np.arange(total), side="right")
    colours = plt.get_cmap("tab10")
    figure, ax = plt.subplots(figsize=(8, 1.9), layout="constrained")
    for token in range(total):
        padded = sequence[token] >= len(lengths)
        colour = "lightgrey" if padded else colours(int(sequence[token]))
        ax.add_patch(plt.Rectangle((token, 0), 0.92, 1, color=colour, alpha=0.75))
        ax.text(token + 0.46, 0.5, str(int(positions[token])), ha="center", va="center", fontsize=9)
    for bound in sorted(set(cu_seqlens.tolist())):  # an empty sequence: two entries, one boundary
        names = " = ".join(f"cu_seqlens[{i}]" for i in np.flatnonzero(cu_seqlens == bound))
        ax.axvline(bound - 0.04, color="black", linewidth=1)
        ax.text(bound - 0.04, 1.15, f"{names} = {bound}", ha="center", fontsize=6, rotation=20)
    ax.set_xlim(-0.2, total + 0.2)
    ax.set_ylim(-0.3, 1.9)
    ax.axis("off")
    ax.set_title(
        f"lengths {list(lengths)} + {padding} padding, offsets {offsets.tolist()}: the position of each token",
        fontsize=9,
        loc="left",
    )
    return figure


def axial(head_dim: int = 64) -> Any:
    """Axial RoPE for a 2-D patch grid: each pair's frequency and the axis it follows, when
    each axis takes the spectrum of half the head ("blocks": EVA-02) or every other frequency
    of the whole head ("alternating": Pixtral)."""
    plt = _pyplot()
    colours = plt.get_cmap("tab10")
    figure, axes = plt.subplots(1, 2, figsize=(8, 2.8), layout="constrained", sharey=True)
    for ax, kind in zip(axes, ("blocks", "alternating"), strict=True):
        rope = RoPE(head_dim, axial=2, axial_frequencies=kind)
        inv_freq = rope.inv_freq
        for pair, (stream, k) in enumerate(zip(rope.pair_streams, rope.pair_frequencies, strict=True)):
            ax.bar(pair, inv_freq[k], color=colours(stream), width=0.85)
        ax.set_yscale("log")
        ax.set_title(f'axial_frequencies="{kind}"', fontsize=9)
        ax.set_xlabel("pair", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0].set_ylabel("radians per position", fontsize=8)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours(s)) for s in range(2)]
    figure.legend(handles, ["rows", "columns"], loc="outside right center", fontsize=8)
    return figure
