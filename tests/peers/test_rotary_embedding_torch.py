"""anyrope's interleaved layout against lucidrains' rotary-embedding-torch and Meta's complex form.

rotary-embedding-torch (0.9): ``RotaryEmbedding(dim, theta=...)`` holds float32 frequencies
``1 / theta ** (arange(0, dim, 2) / dim)``, repeats each for a pair of consecutive features
(the interleaved layout), rotates the first ``dim`` features of the input and leaves the rest;
``rotate_queries_or_keys(t, seq_dim, offset)`` takes positions ``(arange(seq) + offset) /
interpolate_factor`` (position interpolation) and ``theta_rescale_factor`` scales theta by
``factor ** (dim / (dim - 2))`` (NTK-aware scaling). Angles are formed in its frequencies' dtype.

``use_xpos=True`` adds xPos's decay (``rotate_queries_and_keys``), with its exponent centred on
the middle of the sequence.

Meta's reference Llama (llama/model.py) builds ``freqs_cis = polar(1, outer(t, freqs))`` in
complex64 and rotates ``view_as_complex(x.float().reshape(..., -1, 2)) * freqs_cis``: the same
interleaved pairs, on ``(batch, seq, heads, head_dim)`` arrays.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

import anyrope
from anyrope import scaling

torch = pytest.importorskip("torch")
ret = pytest.importorskip("rotary_embedding_torch")

F32_ULP = 2.0**-24


def _tolerance(x: Any, positions: np.ndarray, slack: float = 1e-6) -> np.ndarray:
    """Per-position bound for a peer that forms angles in float32.

    Its angle at position m is off by about m * theta * 2 * 2**-24 rad (theta <= 1: one rounding
    in the float32 frequency, one in the product), so its output by that times |x|; we allow twice
    that, plus ``slack`` * |x| for the roundings of the rotation itself.
    """
    largest = float(x.abs().max())
    return (slack + 4 * positions.astype(np.float64) * F32_ULP) * largest


def _assert_within(ours: Any, theirs: Any, tol: np.ndarray, seq_axis: int = -2) -> None:
    diff = np.abs(ours.double().numpy() - theirs.double().numpy())
    shape = [1] * diff.ndim
    shape[seq_axis] = tol.size
    excess = diff / tol.reshape(shape)
    worst = np.unravel_index(excess.argmax(), excess.shape)
    assert excess.max() <= 1, (
        f"|anyrope - peer| = {diff[worst]:.3g} at {worst}, allowed {tol.flat[worst[seq_axis]]:.3g}"
    )


def _x(shape: tuple[int, ...], dtype: Any = None, seed: int = 0) -> Any:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype or torch.float32)


# (head_dim, rotary_dim): full rotary, and partial (the trailing features pass through)
DIMS = [
    pytest.param(64, 64, id="full64"),
    pytest.param(128, 128, id="full128"),
    pytest.param(64, 32, id="partial"),
]
OFFSETS = [0, 17, 1000, 100_000]


@pytest.mark.parametrize("base", [10000.0, 500000.0])
@pytest.mark.parametrize(("head_dim", "rotary_dim"), DIMS)
def test_default_frequencies(head_dim: int, rotary_dim: int, base: float) -> None:
    peer = ret.RotaryEmbedding(dim=rotary_dim, theta=base)
    ours = np.asarray(anyrope.RoPE(head_dim, base=base, rotary_dim=rotary_dim).inv_freq)
    theirs = peer.freqs.detach().double().numpy()
    assert np.max(np.abs(theirs - ours) / ours) <= 2e-7  # float32 pow: about one rounding


@pytest.mark.parametrize("offset", OFFSETS)
@pytest.mark.parametrize("base", [10000.0, 500000.0])
@pytest.mark.parametrize(("head_dim", "rotary_dim"), DIMS)
def test_float32(head_dim: int, rotary_dim: int, base: float, offset: int) -> None:
    peer = ret.RotaryEmbedding(dim=rotary_dim, theta=base)
    rope = anyrope.RoPE(head_dim, base=base, rotary_dim=rotary_dim, layout="interleaved")
    x = _x((2, 3, 32, head_dim))
    ours = rope(x, offset=offset)
    theirs = peer.rotate_queries_or_keys(x, seq_dim=-2, offset=offset)
    assert ours.dtype == theirs.dtype == torch.float32
    _assert_within(ours, theirs, _tolerance(x, offset + np.arange(32)))
    if rotary_dim < head_dim:  # the features past rotary_dim are left bit-identical by both
        assert torch.equal(ours[..., rotary_dim:], x[..., rotary_dim:])
        assert torch.equal(theirs[..., rotary_dim:], x[..., rotary_dim:])


@pytest.mark.parametrize("offset", [0, 17, 100_000])
@pytest.mark.parametrize(("head_dim", "rotary_dim"), DIMS)
def test_float64_with_float32_frequencies(head_dim: int, rotary_dim: int, offset: int) -> None:
    """float64 input: the peer keeps its float32 angles (so the float32 bound), anyrope float64."""
    peer = ret.RotaryEmbedding(dim=rotary_dim)
    rope = anyrope.RoPE(head_dim, rotary_dim=rotary_dim, layout="interleaved")
    x = _x((2, 3, 32, head_dim), torch.float64)
    ours = rope(x, offset=offset)
    theirs = peer.rotate_queries_or_keys(x, seq_dim=-2, offset=offset)
    assert ours.dtype == theirs.dtype == torch.float64
    _assert_within(ours, theirs, _tolerance(x, offset + np.arange(32)))


@pytest.mark.parametrize("offset", [0, 17, 100_000])
@pytest.mark.parametrize(("head_dim", "rotary_dim"), DIMS)
def test_float64_with_float64_frequencies(head_dim: int, rotary_dim: int, offset: int) -> None:
    """Given anyrope's float64 frequencies, the peer agrees to float64 rounding: same layout."""
    rope = anyrope.RoPE(head_dim, rotary_dim=rotary_dim, layout="interleaved")
    freqs = torch.tensor(rope.inv_freq, dtype=torch.float64)
    # Its angle cache is a float32 buffer; without it the angles stay in the frequencies' dtype.
    peer = ret.RotaryEmbedding(dim=rotary_dim, custom_freqs=freqs, cache_if_possible=False)
    x = _x((2, 3, 32, head_dim), torch.float64)
    ours = rope(x, offset=offset)
    theirs = peer.rotate_queries_or_keys(x, seq_dim=-2, offset=offset)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-12 * float(x.abs().max()))


def test_seq_before_heads() -> None:
    """(batch, seq, heads, dim) arrays: the peer's seq_dim=-3 and anyrope's seq_axis=-3."""
    peer = ret.RotaryEmbedding(dim=64, seq_before_head_dim=True)
    rope = anyrope.RoPE(64, layout="interleaved")
    x = _x((2, 32, 3, 64))
    _assert_within(
        rope(x, offset=5, seq_axis=-3),
        peer.rotate_queries_or_keys(x, offset=5),
        _tolerance(x, 5 + np.arange(32)),
        -3,
    )


def test_cached_keys() -> None:
    """rotate_queries_with_cached_keys: q holds the last q_len of the k_len positions."""
    peer = ret.RotaryEmbedding(dim=64)
    rope = anyrope.RoPE(64, layout="interleaved")
    q, k = _x((1, 4, 8, 64), seed=1), _x((1, 2, 40, 64), seed=2)
    theirs_q, theirs_k = peer.rotate_queries_with_cached_keys(q, k)
    _assert_within(rope(q, offset=32), theirs_q, _tolerance(q, 32 + np.arange(8)))
    _assert_within(rope(k), theirs_k, _tolerance(k, np.arange(40)))


@pytest.mark.parametrize("factor", [2.0, 4.0])
def test_interpolate_factor_is_linear_scaling(factor: float) -> None:
    peer = ret.RotaryEmbedding(dim=64, interpolate_factor=factor)
    rope = anyrope.RoPE(64, layout="interleaved", scaling=scaling.Linear(factor))
    x = _x((1, 2, 64, 64))
    _assert_within(
        rope(x, offset=3000), peer.rotate_queries_or_keys(x, offset=3000), _tolerance(x, 3000 + np.arange(64))
    )


@pytest.mark.parametrize("factor", [2.0, 8.0])
def test_theta_rescale_factor_is_ntk_aware(factor: float) -> None:
    peer = ret.RotaryEmbedding(dim=64, theta_rescale_factor=factor)
    rope = anyrope.RoPE(64, layout="interleaved", scaling=scaling.NTKAware(factor))
    ours = np.asarray(rope.inv_freq)
    assert np.max(np.abs(peer.freqs.detach().double().numpy() - ours) / ours) <= 2e-7
    x = _x((1, 2, 64, 64))
    _assert_within(
        rope(x, offset=3000), peer.rotate_queries_or_keys(x, offset=3000), _tolerance(x, 3000 + np.arange(64))
    )


# --- Meta's complex-number RoPE (llama/model.py, Llama 2; llama3 adds apply_scaling) ------------


def _meta_apply_scaling(freqs: Any) -> Any:
    """Llama 3.1's apply_scaling, as in Meta's llama-models reference (use_scaled_rope=True)."""
    scale_factor, low_freq_factor, high_freq_factor, old_context_len = 8, 1, 4, 8192
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    new_freqs = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            new_freqs.append(freq)
        elif wavelen > low_freq_wavelen:
            new_freqs.append(freq / scale_factor)
        else:
            smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            new_freqs.append((1 - smooth) * freq / scale_factor + smooth * freq)
    return torch.tensor(new_freqs, dtype=freqs.dtype, device=freqs.device)


def _meta_precompute_freqs_cis(dim: int, end: int, theta: float = 10000.0, use_scaled: bool = False) -> Any:
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = torch.arange(end, device=freqs.device, dtype=torch.float32)
    if use_scaled:
        freqs = _meta_apply_scaling(freqs)
    freqs = torch.outer(t, freqs)
    return torch.polar(torch.ones_like(freqs), freqs)  # complex64


def _meta_apply_rotary_emb(xq: Any, xk: Any, freqs_cis: Any) -> tuple[Any, Any]:
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    # reshape_for_broadcast: (seq, dim / 2) -> (1, seq, 1, dim / 2)
    shape = [d if i in (1, xq_.ndim - 1) else 1 for i, d in enumerate(xq_.shape)]
    freqs_cis = freqs_cis.view(*shape)
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


# flavour -> (theta, use_scaled_rope, the matching anyrope scaling); head_dim 128 for both.
META = {
    "llama2": (10000.0, False, None),
    "llama3.1": (500000.0, True, scaling.Llama3(8.0, 1.0, 4.0, 8192)),
}


@pytest.mark.parametrize("start_pos", [0, 17, 4000])
@pytest.mark.parametrize("flavour", list(META))
def test_meta_complex(flavour: str, start_pos: int) -> None:
    theta, use_scaled, method = META[flavour]
    head_dim, seq = 128, 24
    # The reference precomputes max_seq_len * 2 rows and slices [start_pos : start_pos + seqlen].
    freqs_cis = _meta_precompute_freqs_cis(head_dim, 8192, theta, use_scaled)
    freqs_cis = freqs_cis[start_pos : start_pos + seq]
    rope = anyrope.RoPE(head_dim, base=theta, layout="interleaved", scaling=method)
    xq, xk = _x((2, seq, 4, head_dim), seed=3), _x((2, seq, 2, head_dim), seed=4)
    theirs_q, theirs_k = _meta_apply_rotary_emb(xq, xk, freqs_cis)
    ours_q, ours_k = rope(xq, xk, offset=start_pos, seq_axis=-3)
    # complex64 products: the float32 bound, plus a little for polar's own rounding.
    positions = start_pos + np.arange(seq)
    _assert_within(ours_q, theirs_q, _tolerance(xq, positions, slack=2e-6), -3)
    _assert_within(ours_k, theirs_k, _tolerance(xk, positions, slack=2e-6), -3)


@pytest.mark.parametrize("scale_base", [512, 16])
def test_xpos(scale_base: int) -> None:
    """``use_xpos=True`` (``rotate_queries_and_keys``) against ``RoPE(xpos_scale_base=...)``.

    The peer takes the decay's exponent from the middle of the sequence, ``(t - seq // 2) /
    scale_base``, where anyrope takes the position itself: its q is anyrope's times ``zeta **
    (-(seq // 2) / scale_base)`` per pair and its k anyrope's divided by that, so scores agree and
    rotated q and k agree after that factor. Both in float64 on anyrope's frequencies; the peer's
    zeta is a float32 buffer (relative error 6e-8, raised to at most 32 / 16 here)."""
    rope = anyrope.RoPE(64, layout="interleaved", xpos_scale_base=float(scale_base))
    freqs = torch.tensor(rope.inv_freq, dtype=torch.float64)
    peer = ret.RotaryEmbedding(
        dim=64, custom_freqs=freqs, use_xpos=True, xpos_scale_base=scale_base, cache_if_possible=False
    )
    q, k = _x((2, 3, 32, 64), torch.float64, seed=3), _x((2, 3, 32, 64), torch.float64, seed=4)
    theirs_q, theirs_k = peer.rotate_queries_and_keys(q, k)
    ours_q, ours_k = rope(q, k)
    zeta = (torch.arange(0, 64, 2, dtype=torch.float64) / 64 + 0.4) / 1.4
    centre = (zeta ** (-(32 // 2) / scale_base)).repeat_interleave(2)  # interleaved pairs
    atol = 1e-6 * float(max(ours_q.abs().max(), ours_k.abs().max()))
    torch.testing.assert_close(ours_q * centre, theirs_q, rtol=0, atol=atol)
    torch.testing.assert_close(ours_k / centre, theirs_k, rtol=0, atol=atol)
    scores = ours_q @ ours_k.transpose(-1, -2)
    torch.testing.assert_close(
        scores, theirs_q @ theirs_k.transpose(-1, -2), rtol=1e-6, atol=1e-6 * float(scores.abs().max())
    )
