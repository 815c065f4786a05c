"""Axial RoPE against the vision models and libraries it describes.

* transformers' Pixtral vision encoder (``PixtralVisionRotaryEmbedding``): rows take the even
  frequencies of the head's spectrum and columns the odd ones, each on a contiguous half of the
  pairs, half layout: ``RoPE(head_dim, axial=2, axial_frequencies="alternating")`` with
  ``grid_positions((rows, columns))``. Checked at the rotary module (float64 q and k through
  the family's own apply function) and in a tiny ``PixtralVisionModel`` whose rotary module
  returns anyrope's tables instead (last hidden states).
* transformers' Llama 4 vision encoder (``Llama4VisionRotaryEmbedding``, complex
  ``freqs_ci``): columns then rows, each with the spectrum of half the head ("blocks"),
  interleaved pairs, patches counted from 1 and the class token (last) unrotated.
* rotary-embedding-torch's ``get_axial_freqs`` (``freqs_for="lang"``): each axis a
  ``RotaryEmbedding(dim)`` of its own, concatenated, interleaved pairs, the rest of the head
  untouched: ``RoPE(head_dim, rotary_dim=axes * dim, layout="interleaved", axial=axes)``.

Both peers form their angles in float32 from positions below 16: they are off by at most
16 * 2**-24 rad, so outputs of order 1 agree to 1e-5.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest

import anyrope

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", minversion="5.0")

from transformers.models.pixtral import modeling_pixtral

ATOL = 1e-5


def _randn(*shape: int, seed: int) -> Any:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _pixtral_positions(rows: int, columns: int) -> Any:
    """(patches, 2) as PixtralVisionModel.forward forms them."""
    h, w = torch.meshgrid(torch.arange(rows), torch.arange(columns), indexing="ij")
    return torch.stack([h.flatten(), w.flatten()], dim=-1)


def test_pixtral_rotary_module() -> None:
    config = transformers.PixtralVisionConfig(hidden_size=256, num_attention_heads=4, head_dim=64)
    rotary = modeling_pixtral.PixtralVisionRotaryEmbedding(config)
    position_ids = _pixtral_positions(5, 7)
    q, k = _randn(1, 4, 35, 64, seed=0), _randn(1, 4, 35, 64, seed=1)
    cos, sin = rotary(q, position_ids)
    theirs = modeling_pixtral.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=0)
    rope = anyrope.RoPE(
        64, base=config.rope_parameters["rope_theta"], axial=2, axial_frequencies="alternating"
    )
    positions = anyrope.grid_positions((5, 7), like=q)
    assert torch.equal(positions, position_ids.T)
    ours = rope(q, k, positions=positions)
    for mine, peer in zip(ours, theirs, strict=True):
        torch.testing.assert_close(mine, peer, rtol=0, atol=ATOL)


def test_pixtral_vision_model() -> None:
    config = transformers.PixtralVisionConfig(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, head_dim=16,
        image_size=32, patch_size=4, num_channels=3, initializer_range=0.1,
    )  # fmt: skip
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.PixtralVisionModel(config).eval()
    pixels = torch.randn(1, 3, 24, 32, generator=torch.Generator().manual_seed(2))
    sizes = torch.tensor([[24, 32]])
    rope = anyrope.RoPE(
        16, base=config.rope_parameters["rope_theta"], axial=2, axial_frequencies="alternating"
    )

    def forward(x: Any, position_ids: Any) -> tuple[Any, Any]:  # position_ids: (patches, 2)
        cos, sin = rope.cos_sin(position_ids.T, like=x)
        return torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)

    with torch.no_grad():
        stock = model(pixels, image_sizes=sizes).last_hidden_state
        model.patch_positional_embedding.forward = forward
        patched = model(pixels, image_sizes=sizes).last_hidden_state
        flat = model(pixels.flip(-1), image_sizes=sizes).last_hidden_state
    torch.testing.assert_close(patched, stock, rtol=0, atol=ATOL * float(stock.abs().max()))
    assert float((flat - stock).abs().max()) > 100 * ATOL  # the test sees the image, so could fail


def test_llama4_vision_rotary() -> None:
    from transformers.models.llama4 import modeling_llama4

    config = transformers.Llama4VisionConfig(
        hidden_size=128, num_attention_heads=2, image_size=40, patch_size=8
    )
    freqs_ci = modeling_llama4.Llama4VisionRotaryEmbedding(config)(torch.zeros(1))  # (26, 1, 32)
    side = config.image_size // config.patch_size  # 5 x 5 patches, then the class token
    q = torch.randn(
        1, side * side + 1, 2, 64, generator=torch.Generator().manual_seed(5)
    )  # (b, seq, heads, d)
    k = torch.randn(1, side * side + 1, 2, 64, generator=torch.Generator().manual_seed(6))
    theirs = modeling_llama4.vision_apply_rotary_emb(q, k, freqs_ci)
    rope = anyrope.RoPE(64, base=config.rope_parameters["rope_theta"], layout="interleaved", axial=2)
    rows_columns = anyrope.grid_positions((side, side), start=1, like=q)
    positions = torch.cat([rows_columns.flip(0), torch.zeros(2, 1, dtype=rows_columns.dtype)], dim=1)
    ours = rope(q, k, positions=positions, seq_axis=-3)
    for mine, peer in zip(ours, theirs, strict=True):
        torch.testing.assert_close(mine, peer, rtol=0, atol=ATOL)
    assert torch.equal(ours[0][:, -1], q[:, -1])


@pytest.mark.parametrize("axes", [2, 3])
def test_rotary_embedding_torch_axial(axes: int) -> None:
    ret = pytest.importorskip("rotary_embedding_torch")
    grid = (3, 4, 5)[:axes]
    peer = ret.RotaryEmbedding(dim=16, freqs_for="lang")
    freqs = peer.get_axial_freqs(*grid)  # (*grid, axes * 16)
    x = _randn(2, *grid, 64, seed=3).float()  # (batch, *grid, head_dim): the last 64 - axes*16 pass
    theirs = ret.apply_rotary_emb(freqs, x)
    rope = anyrope.RoPE(64, rotary_dim=16 * axes, layout="interleaved", axial=axes)
    flat = x.reshape(2, -1, 64)
    ours = rope(flat, positions=anyrope.grid_positions(grid, like=flat)).reshape(theirs.shape)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=ATOL)
    assert torch.equal(ours[..., 16 * axes :], x[..., 16 * axes :])
