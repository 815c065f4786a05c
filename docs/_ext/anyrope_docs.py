"""Build-time content for the docs: every figure, drawn by anyrope itself, and the backend matrix.

Runs when the builder starts and writes into docs/_generated/ (ignored by git): the figures of
:mod:`anyrope.plots`, the benchmark plot (benchmarks/rope_plot.py) from the committed results in
docs/data/, and backends.md, the support matrix read from backends/*/backend.toml.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))  # backend_toml: the one reader of backends/ (stdlib only)
import backend_toml

FIGURES = [
    "frequencies",
    "yarn_ramp",
    "llama3_bands",
    "decay",
    "wrap_around",
    "layouts",
    "mrope_sections",
    "axial",
    "packed_layout",
]


def _figures(out: Path) -> None:
    import matplotlib.pyplot as plt

    from anyrope import plots

    for name in FIGURES:
        figure = getattr(plots, name)()
        figure.savefig(out / f"{name}.png", dpi=110)
        plt.close(figure)


def _benchmark(out: Path) -> None:
    # benchmarks/ is a folder of scripts beside the package; its plot needs matplotlib only.
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from rope_plot import plot
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    for path in sorted((ROOT / "docs" / "data").glob("bench-*.json")):
        summary = json.loads(path.read_text())
        why_not = plot(summary, out / f"{path.stem}.png")
        if why_not:
            raise RuntimeError(f"could not plot {path}: {why_not}")


def _cell(values: list[str] | None) -> str:
    return ", ".join(values) if values else "-"


def backend_matrix(root: Path = ROOT) -> str:
    """The support matrix and each backend's notes and deviations, as MyST Markdown."""
    specs = list(backend_toml.load(root).values())
    lines = [
        "| backend | module | devices | dtypes | compiled | autograd | install |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for spec in specs:
        install = spec.get("user-install", "").split("(")[0].strip().rstrip(",")
        lines.append(
            f"| {spec['name']} | `{spec['module']}` | {_cell(spec.get('devices'))} | "
            f"{_cell(spec.get('dtypes'))} | {_cell(spec.get('compilers'))} | "
            f"{'yes' if spec.get('autograd') else 'no'} | {install} |"
        )
    lines += ["", "## Kernels", "", kernel_table()]
    for spec in specs:
        lines += ["", f"### {spec['name']}", "", spec.get("user-install", ""), ""]
        for key, note in spec.get("notes", {}).items():
            lines.append(f"- **{key}**: {note}")
        deviations: dict[str, dict[str, Any]] = spec.get("deviations", {})
        if deviations:
            lines += [
                "",
                (
                    "Known deviations (tests marked with the feature are skipped or expected to fail; "
                    "with mode rounding, forms of one rotation are compared to rounding, not bit for bit):"
                ),
                "",
            ]
            lines += [
                f"- `{feature}` ({d['mode']}{''.join(f', {device} only' for device in d.get('devices', []))}): "
                f"{d['reason']}"
                for feature, d in deviations.items()
            ]
        else:
            lines += ["", "No known deviations: the whole conformance suite passes."]
    return "\n".join(lines) + "\n"


def kernel_table() -> str:
    """The kernel registry as a table: its declarations are what selection and the tests read."""
    import anyrope

    lines = [
        (
            "Kernels are tried in this order; each takes the calls its declaration covers, and the "
            "generic one takes every call: no kernel declines a call its declaration covers. "
            "`anyrope.use_fast_paths(False)` keeps to the generic one, "
            '`use_fast_paths("name")` to one by name, which raises, saying what the call has that '
            "the kernel does not take, before any work."
        ),
        "",
        (
            "| kernel | libraries | devices | layouts | dtypes | positions from | in place | traceable "
            "| gradients | does not take | needs |"
        ),
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for k in anyrope.kernels():
        cells = [
            f"`{k.name}`",
            ", ".join(sorted(k.libraries)) or "any",
            ", ".join(sorted(k.devices)) or "any",
            ", ".join(sorted(k.layouts)),
            ", ".join(sorted(k.dtypes)) or "any",
            ", ".join(sorted(k.sources)) or "any",
            *("yes" if flag else "no" for flag in (k.inplace, k.traceable, k.differentiable)),
            "; ".join(k.refuses()) or "-",
            ", ".join(k.requires) or "-",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", *(f"- `{k.name}`: {k.summary}" for k in anyrope.kernels())]
    return "\n".join(lines)


_WIDTH = {
    "head": "whole head",
    "partial": "`partial_rotary_factor`",
    "rotary_dim": "`rotary_dim`",
    "mla": "`qk_rope_head_dim` slice",
    "clvp": "`max(projection_dim // (2 * heads), 32)`",
}
_NOPE = {
    "sliding_only": "only sliding-attention layers rotate",
    "sliding_when_windowed": "with a sliding window, only sliding layers rotate",
    "no_rope_layers": "`no_rope_layers`",
    "layer_rope_theta": "`layer_rope_theta` 0",
    "layer_rope_flag": "`layer_rope_theta` 0",
    "none_entry": "`rope_parameters[type]` None",
    "sliding_or_dense_prefix": "sliding layers and a dense prefix",
    "full_with_theta": "only full-attention layers",
    "position_embedding_type=rope": "only with `position_embedding_type: rope`",
    "position_embedding_type=rotary": "only with `position_embedding_type: rotary`",
    "position_embeddings_type=rotary": "only with `position_embeddings_type: rotary`",
    "use_mem_rope": "only with `use_mem_rope`",
}


_ROPE_TYPES = {
    "all": "all",
    "default": "default only",
    "fixed": "default (rope scaling ignored)",
}


def family_table() -> str:
    """Every transformers model family that rotates, from anyrope's family data, with counts."""
    from anyrope._families import FAMILIES

    def status(f: Any) -> str:
        if f.unsupported:
            return f"refused: {f.unsupported}"
        return "supported"

    supported = [f for f in FAMILIES if status(f) == "supported"]
    in_model = sum(not f.not_in_model for f in supported)
    layouts = {
        name: sum(f.layout == name and not f.layout_key for f in supported)
        for name in ("half", "interleaved")
    }
    summary = (
        f"{len(FAMILIES)} model families (transformers `model_type`s) rotate queries and keys; "
        f"`from_hf_config` reads {len(supported)} of them exactly ({layouts['half']} half, "
        f"{layouts['interleaved']} interleaved, {sum(bool(f.layout_key) for f in supported)} set by "
        f"`rope_interleave`; {sum(bool(f.multi_axis) for f in supported)} with M-RoPE's multi-axis "
        f"positions), and refuses {sum(bool(f.unsupported) for f in FAMILIES)} with the reason. "
        f"The `peers` test session checks every supported family's rotation against the family's own "
        f"rotary code, and runs {in_model} of them in a tiny model of their own through "
        "`anyrope.integrations.transformers`: outputs with a left-padded batch row, and for decoders "
        "16 greedy tokens with the KV cache; the last column says why the others are not."
    )
    lines = [
        summary,
        "",
        "| `model_type` | kind | pairing | rotated width | rope types | layers | `from_hf_config` | checked in its model |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for f in FAMILIES:
        pairing = f"`{f.layout_key}` (default interleaved)" if f.layout_key else f.layout
        pairing += ", clockwise" if f.clockwise else ""
        if f.multi_axis:
            pairing += f"; M-RoPE, {f.multi_axis}" + (
                f" (default `{list(f.mrope_section)}`)" if f.mrope_section else ""
            )
        layers = ", ".join(
            part
            for part in (
                "per layer type" if f.per_layer else "",
                f"full-attention heads `global_head_dim` (default {f.global_head_dim})"
                if f.global_head_dim
                else "",
                f"NoPE: {_NOPE[f.nope]}" if f.nope else "",
                'saved `layer_types` list an "mlp" block after each layer' if f.mlp_blocks else "",
                f"layer types read parameters {', '.join(f'`{k}`' for k in sorted(set(f.rope_keys.values())))}"
                if f.rope_keys
                else "",
            )
            if part
        )
        kind = f.scope.replace("_", " ")
        rope_types = _ROPE_TYPES[f.rope_types] + (", HunYuan's NTK alpha" if f.ntk_alpha else "")
        rope_types += ", LongRoPE with `short_mscale`/`long_mscale`" if f.mscales else ""
        rope_types += "".join(f", `{old}` read as `{new}`" for old, new in f.rope_type_aliases.items())
        if f.log_frequency_scale:  # a checkpoint weight: use_anyrope reads it, from_hf_config cannot
            rope_types += f", frequencies times `exp({f.log_frequency_scale})` of the checkpoint"
        checked = "-" if status(f) != "supported" else (f"no: {f.not_in_model}" if f.not_in_model else "yes")
        lines.append(
            f"| `{f.model_type}` | {kind} | {pairing} | {_WIDTH[f.width]} | {rope_types} | {layers or '-'} "
            f"| {status(f)} | {checked} |"
        )
    return "\n".join(lines) + "\n"


def vision_table() -> str:
    """Every vision tower rotary (``rope_type="axial"``) of transformers, from anyrope's records."""
    from anyrope._vision_families import VISION_FAMILIES

    supported = [v for v in VISION_FAMILIES if not v.unsupported]
    summary = (
        f"{len(VISION_FAMILIES)} vision towers (vision config `model_type`s) rotate image patches by "
        f"position per axis; `from_hf_config` reads {len(supported)} of them exactly and refuses "
        f"{len(VISION_FAMILIES) - len(supported)} with the reason. The `peers` test session checks every "
        "supported tower's rotary module, patched by `use_anyrope`, against its own tables at positions "
        "whose axes differ (Llama 4's, which keeps the table of one patch grid, in its vision encoder), "
        "and runs every supported tower whole in its own tiny model against the stock one."
    )
    lines = [
        summary,
        "",
        "| vision `model_type` | axes | frequencies per axis | pairing | head width | default base | `from_hf_config` |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for v in VISION_FAMILIES:
        heads = f"({v.heads_key} * {v.divisor_key})" if v.divisor_key else v.heads_key
        width = f"`{v.width_key} // {heads}`"
        if v.reads_head_dim:
            width = f"`head_dim`, else {width}"
        if v.partial:
            width += f"; `2 * ((head_dim // {v.axes}) // 2)` per axis"
        status = f"refused: {v.unsupported}" if v.unsupported else "supported"
        lines.append(
            f"| `{v.model_type}` | {v.axes} | {v.frequencies} | {v.layout} | {width} | {v.base:g} | {status} |"
        )
    return "\n".join(lines) + "\n"


def _generate(app: Any) -> None:
    out = Path(app.srcdir) / "_generated"
    out.mkdir(exist_ok=True)
    _figures(out)
    _benchmark(out)
    (out / "backends.md").write_text(backend_matrix())
    (out / "families.md").write_text(family_table())
    (out / "vision_families.md").write_text(vision_table())


def setup(app: Any) -> dict[str, Any]:
    app.connect("builder-inited", _generate)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
