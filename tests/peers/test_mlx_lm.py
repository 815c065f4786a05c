"""anyrope's drop-in for mlx-lm's rope modules against mlx-lm's own (``anyrope.integrations.mlx_lm``).

Every rope kind mlx-lm's ``initialize_rope`` builds is rotated by three modules on the same
random float32 input: mlx-lm's own, :func:`initialize_rope`'s (frequencies exact in float64,
from the config) and :func:`from_mlx_lm`'s (the reciprocals of the module's float32 periods),
at int offsets, 0-d and per-row array offsets (negative ones included, as ``BatchKVCache``
passes for left-padded rows), eagerly and under ``mx.compile``. Then a tiny random Llama rotates
with either and must give the same logits and the same greedy tokens, with mlx-lm's KV caches.
"""

from __future__ import annotations

import importlib
import math
from typing import Any

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

from mlx import nn
from mlx.utils import tree_flatten
from mlx_lm.models import llama, phi3, rope_utils
from mlx_lm.models.cache import BatchKVCache, make_prompt_cache

import anyrope
from anyrope.integrations import mlx_lm as am

F32_EPS = 2.0**-24  # float32's unit roundoff (half an ulp of 1.0)
# Tolerance, per position p (see _bound). mlx-lm forms the angle p * theta in float32 from
# float32 frequencies that took a few float32 operations to make (a pow and a reciprocal, and
# for Llama 3 and YaRN a blend of two frequencies), each rounding by at most F32_EPS relative:
# its angle is off by up to about 8 * F32_EPS * |p| * theta_max, while anyrope's is within 3e-7
# rad of exact. A pair turned by a wrong angle moves by that angle times its norm: we allow
# 16 * F32_EPS * |p| * theta_max * max|x| for the angle (twice the estimate), plus
# 16 * F32_EPS * max|x| (1e-6) for rounding: cos and sin (an ulp each, anyrope's sums of digit
# angles a few), x cos - y sin (three roundings), and mlx-lm's multiplier. All of it times that
# multiplier (YaRN's mscale, LongRoPE's scale), which the rotated features carry. Measured on
# CPU: at most 1.1 * F32_EPS * |p| * theta_max for the angle and 1.8 * F32_EPS for rounding.
ANGLE_EPS = 16
ROUNDING_EPS = 16

HEAD = 32
SEQ = 16
BATCH = 2
HEADS = 3

LONG = [1.0 + 0.1 * i for i in range(HEAD // 2)]
SHORT = [1.0 + 0.01 * i for i in range(HEAD // 2)]

# (dims, base, traditional, scaling_config, max_position_embeddings), as mlx-lm's models pass them.
KINDS = {
    "plain": (HEAD, 10000.0, False, None, None),
    "plain-traditional": (HEAD, 10000.0, True, None, None),
    "partial": (HEAD // 2, 10000.0, False, None, None),
    "partial-traditional": (HEAD // 2, 1e6, True, None, None),
    "linear": (HEAD, 10000.0, False, {"type": "linear", "factor": 4.0}, None),
    "llama3": (
        HEAD,
        500000.0,
        False,
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        131072,
    ),
    "llama3-defaults": (HEAD, 500000.0, True, {"rope_type": "llama3", "factor": 32.0}, 131072),
    "yarn": (
        HEAD,
        10000.0,
        False,
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096},
        16384,
    ),
    "yarn-mscale": (
        HEAD // 2,
        10000.0,
        True,
        {"type": "deepseek_yarn", "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 0.5, "beta_fast": 24},
        163840,
    ),
    "longrope": (
        HEAD,
        10000.0,
        False,
        {
            "rope_type": "longrope",
            "short_factor": SHORT,
            "long_factor": LONG,
            "original_max_position_embeddings": 4096,
        },
        131072,
    ),
    "dynamic": (HEAD, 10000.0, False, {"rope_type": "dynamic", "factor": 2.0}, 2048),
    "proportional": (
        HEAD,
        10000.0,
        False,
        {"rope_type": "proportional", "partial_rotary_factor": 0.25},
        None,
    ),
}
# Per kind, the int offsets: both sides of LongRoPE's 4096 threshold (mlx-lm uses the long
# factors on both), and of DynamicNTK's 2048, where the base starts to grow.
OFFSETS = {
    "longrope": [0, 4090, 10000],
    "dynamic": [0, 2040, 5000],
}
DEFAULT_OFFSETS = [0, 17, 5000]
ROW_OFFSETS = [3, -5]  # BatchKVCache: a left-padded row starts at a negative offset


def _input(width: int = HEAD, seed: int = 0, dtype: Any = None) -> Any:
    x = np.random.default_rng(seed).standard_normal((BATCH, HEADS, SEQ, width)).astype(np.float32)
    return mx.array(x) if dtype is None else mx.array(x).astype(dtype)


def _bound(drop_in: am.AnyRoPE, x: Any, offset: Any) -> np.ndarray:
    """The allowed |difference| per batch row and position, shape (batch, 1, seq, 1)."""
    rope = drop_in.rope
    starts = np.broadcast_to(
        np.asarray(np.array(offset) if isinstance(offset, mx.array) else offset), (BATCH,)
    )
    positions = np.abs(starts[:, None] + np.arange(SEQ)).astype(np.float64)
    fastest = max(abs(f) for f in rope.inv_freq)
    largest = float(np.max(np.abs(np.array(x.astype(mx.float32)))))
    per_position = (
        max(rope.attention_scaling, 1.0)
        * largest
        * F32_EPS
        * (ROUNDING_EPS + ANGLE_EPS * positions * fastest)
    )
    return per_position[:, None, :, None]


def _assert_close(ours: Any, theirs: Any, bound: np.ndarray, what: str) -> None:
    assert ours.shape == theirs.shape
    assert ours.dtype == theirs.dtype
    diff = np.abs(np.array(ours.astype(mx.float32)) - np.array(theirs.astype(mx.float32)))
    excess = diff / bound
    worst = np.unravel_index(np.argmax(excess), excess.shape)
    assert excess.max() <= 1, (
        f"{what}: |anyrope - mlx-lm| = {diff[worst]:.3g} at {worst}, allowed {bound[worst[0], 0, worst[2], 0]:.3g}"
    )


def _offsets(kind: str) -> list[Any]:
    ints: list[Any] = OFFSETS.get(kind, DEFAULT_OFFSETS)
    if kind == "dynamic":  # mlx-lm's DynamicNTK reads the offset on the host: one int or a 0-d array
        return [*ints, mx.array(ints[2])]
    return [*ints, mx.array(ints[1]), mx.array(ROW_OFFSETS), mx.array([ints[2], -ints[1]])]


@pytest.fixture(params=sorted(KINDS), scope="module")
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.mark.parametrize("source", ["initialize_rope", "from_mlx_lm"])
def test_matches_mlx_lm(kind: str, source: str) -> None:
    args = KINDS[kind]
    theirs = rope_utils.initialize_rope(*args)
    ours = am.initialize_rope(*args) if source == "initialize_rope" else am.from_mlx_lm(theirs)
    assert isinstance(ours, am.AnyRoPE)
    assert isinstance(ours, nn.Module)
    assert dict(tree_flatten(ours.parameters())) == {}  # nothing for load_weights to look for
    x = _input()
    compiled = mx.compile(lambda x, offset: ours(x, offset=offset))
    for offset in _offsets(kind):
        expected = theirs(x, offset=offset)
        bound = _bound(ours, x, offset)
        _assert_close(ours(x, offset=offset), expected, bound, f"{kind} offset={offset}")
        _assert_close(compiled(x, offset), expected, bound, f"{kind} offset={offset}, compiled")
        if ours.dims < HEAD:  # the features past dims pass through bit-identical
            assert np.array_equal(
                np.array(ours(x, offset=offset)[..., ours.dims :]), np.array(x[..., ours.dims :])
            )


def test_longrope_uses_long_factors_everywhere() -> None:
    """mlx-lm's SuScaledRoPE turns by the long factors below the original context too (unlike
    transformers): so does the drop-in, and it rotates otherwise than the short factors would."""
    args = KINDS["longrope"]
    ours = am.initialize_rope(*args)
    assert ours.rope.inv_freq == ours.rope.inv_freq_at(1) == ours.rope.inv_freq_at(100_000)
    short = anyrope.RoPE(HEAD, scaling=anyrope.scaling.Linear(1.0))
    assert ours.rope.inv_freq[1] == pytest.approx(short.inv_freq[1] / LONG[1], rel=1e-12)
    assert ours.rope.attention_scaling == pytest.approx(
        math.sqrt(1 + math.log(32) / math.log(4096)), rel=1e-12
    )


def test_dynamic_per_row_offsets_under_compile() -> None:
    """mlx-lm's DynamicNTK reads the offset on the host, so it takes neither per-row offsets nor
    mx.compile; the drop-in takes both, choosing the base from the largest position on the device."""
    ours = am.initialize_rope(*KINDS["dynamic"])
    x = _input()
    compiled = mx.compile(lambda x, offset: ours(x, offset=offset))
    for offset in (mx.array([3000, -5]), mx.array(3000)):
        rows = offset if offset.ndim else mx.broadcast_to(offset, (BATCH,))
        # The longest sequence is max(offset) + SEQ: every row turns with that sequence's base.
        fixed = am.AnyRoPE(ours.rope.at_length(int(mx.max(rows).item()) + SEQ))
        _assert_close(
            compiled(x, offset), fixed(x, offset=offset), _bound(ours, x, offset), f"offset={offset}"
        )


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision(dtype: str) -> None:
    """In float16 and bfloat16 both round their float32 result once: at most an ulp apart, or
    two where the float32 values straddle a rounding boundary."""
    theirs = rope_utils.initialize_rope(*KINDS["llama3"])
    ours = am.from_mlx_lm(theirs)
    x = _input(dtype=getattr(mx, dtype))
    ulp = 2.0 ** (-10 if dtype == "float16" else -7)  # relative spacing just above 1.0
    for offset in (0, 5000, mx.array(ROW_OFFSETS)):
        result = ours(x, offset=offset)
        assert result.dtype == x.dtype
        bound = _bound(ours, x, offset) + 2 * ulp * float(mx.max(mx.abs(x.astype(mx.float32))).item())
        _assert_close(result, theirs(x, offset=offset), bound, f"{dtype} offset={offset}")


@pytest.mark.parametrize("source", ["initialize_rope", "from_mlx_lm"])
def test_yarn_scale_and_inverse(source: str) -> None:
    """YarnRoPE also takes scale= (positions times scale) and inverse= (DeepSeek-V4.1)."""
    theirs = rope_utils.YarnRoPE(
        32, traditional=True, base=160000.0, scaling_factor=16.0, original_max_position_embeddings=65536
    )
    if source == "initialize_rope":
        ours = am.initialize_rope(
            32,
            160000.0,
            True,
            {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 65536},
        )
    else:
        ours = am.from_mlx_lm(theirs)
    x = _input(width=32)
    for scale, inverse in ((4, False), (4, True), (0.5, False)):
        for offset in (7, mx.array(ROW_OFFSETS)):
            expected = theirs(x, offset=offset, scale=scale, inverse=inverse)
            got = ours(x, offset=offset, scale=scale, inverse=inverse)
            bound = _bound(ours, x, offset) * max(scale, 1) * ours.rope.attention_scaling**2
            _assert_close(got, expected, bound, f"scale={scale} inverse={inverse} offset={offset}")
    round_trip = ours(ours(x, offset=9), offset=9, inverse=True)
    assert np.allclose(np.array(round_trip), np.array(x), atol=1e-5)


def test_partial_rotary_input_wider_than_dims() -> None:
    """mlx-lm passes whole heads to a rope of fewer dims (Phi's partial rotary): the rest pass."""
    theirs = nn.RoPE(16, traditional=False, base=10000.0)
    ours = am.from_mlx_lm(theirs)
    for width in (16, 24, 64):
        x = _input(width=width)
        for offset in (5, mx.array(ROW_OFFSETS)):
            _assert_close(
                ours(x, offset=offset), theirs(x, offset=offset), _bound(ours, x, offset), f"width {width}"
            )


# ----------------------------------------------------------------------------------------------
# A tiny Llama


def _tiny_llama(scaling: dict[str, Any] | None = None, traditional: bool = False) -> llama.Model:
    """Two layers of head_dim 16 with random weights. An untied output layer and q and k scaled
    up (sharper attention, so positions matter) make greedy decoding wander over many tokens
    with margins of 0.03 or more between the best two logits; tied, it repeats its last token."""
    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        vocab_size=97,
        rope_theta=500000.0,
        rope_traditional=traditional,
        rope_scaling=scaling,
        max_position_embeddings=131072,
        tie_word_embeddings=False,
    )
    mx.random.seed(1)
    model = llama.Model(args)
    for layer in model.layers:
        layer.self_attn.q_proj.weight = 4 * layer.self_attn.q_proj.weight
        layer.self_attn.k_proj.weight = 4 * layer.self_attn.k_proj.weight
    mx.eval(model.parameters())
    return model


def _twins(**kwargs: Any) -> tuple[llama.Model, llama.Model]:
    stock = _tiny_llama(**kwargs)
    patched = _tiny_llama(**kwargs)
    patched.update(stock.parameters())
    assert am.patch_model(patched) == 2
    return stock, patched


# The logits differ only through the rotations (within _bound's few float32 ulps at these short
# positions, relative to |q| and |k|), carried through two layers: allow 1e-4 of their range.
LOGIT_RTOL = 1e-4


def _assert_logits(ours: Any, theirs: Any) -> None:
    a, b = np.array(ours), np.array(theirs)
    assert a.shape == b.shape
    assert np.max(np.abs(a - b)) <= LOGIT_RTOL * np.max(np.abs(b)), np.max(np.abs(a - b))


@pytest.fixture(scope="module")
def llama3_twins() -> tuple[llama.Model, llama.Model]:
    return _twins(scaling=KINDS["llama3"][3])


def test_patch_model(llama3_twins: tuple[llama.Model, llama.Model]) -> None:
    stock, patched = llama3_twins
    for layer in patched.model.layers:
        assert isinstance(layer.self_attn.rope, am.AnyRoPE)
        assert type(layer.self_attn.rope.original) is rope_utils.Llama3RoPE
        # Llama3RoPE keeps float32 periods only; the model's args give the exact frequencies.
        assert isinstance(layer.self_attn.rope.rope.scaling, anyrope.scaling.Llama3)
    for layer in stock.model.layers:
        assert type(layer.self_attn.rope) is rope_utils.Llama3RoPE
    assert sorted(k for k, _ in tree_flatten(patched.parameters())) == sorted(
        k for k, _ in tree_flatten(stock.parameters())
    )
    assert am.patch_model(patched) == 0  # already patched: nothing more to do
    tokens = mx.array(np.random.default_rng(1).integers(0, 97, (2, 12)))
    _assert_logits(patched(tokens), stock(tokens))
    _assert_logits(mx.compile(patched)(tokens), stock(tokens))


def test_patch_model_reads_module_frequencies_without_matching_args() -> None:
    """Frequencies come from the args only where those describe the module (to float32
    precision): else from the module's own periods, and with exact=False always."""
    model = _tiny_llama(scaling=KINDS["llama3"][3])
    assert am.patch_model(model, exact=False) == 2
    assert isinstance(model.layers[0].self_attn.rope.rope.scaling, am.StoredFrequencies)
    model = _tiny_llama(scaling=KINDS["llama3"][3])
    model.args.rope_theta = 10000.0  # not what the modules were built with
    assert am.patch_model(model) == 2
    assert isinstance(model.layers[0].self_attn.rope.rope.scaling, am.StoredFrequencies)
    module = rope_utils.initialize_rope(*KINDS["llama3"])
    args = {
        "rope_theta": KINDS["llama3"][1],
        "rope_scaling": KINDS["llama3"][3],
        "max_position_embeddings": 131072,
    }
    assert isinstance(am.from_mlx_lm(module, args=args).rope.scaling, anyrope.scaling.Llama3)


def test_phi3_partial_longrope() -> None:
    """Phi-3/Phi-4-mini: SuScaledRoPE over 12 of 16 features (partial_rotary_factor 0.75),
    original_max_position_embeddings among the args rather than in rope_scaling, type "su"."""
    pairs = 6
    args = phi3.ModelArgs(
        model_type="phi3",
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        vocab_size=97,
        partial_rotary_factor=0.75,
        rope_scaling={"type": "su", "short_factor": SHORT[:pairs], "long_factor": LONG[:pairs]},
    )
    mx.random.seed(1)
    stock = phi3.Model(args)
    mx.eval(stock.parameters())
    patched = phi3.Model(args)
    patched.update(stock.parameters())
    assert am.patch_model(patched) == 2
    rope = patched.model.layers[0].self_attn.rope
    assert (rope.dims, rope.rope.head_dim) == (12, 12)
    assert isinstance(rope.rope.scaling, anyrope.scaling.LongRoPE)
    prompt = [5, 17, 3, 88, 41, 2, 60]
    ours, our_logits = _greedy(patched, prompt, 8)
    theirs, their_logits = _greedy(stock, prompt, 8)
    assert ours == theirs
    for a, b in zip(our_logits, their_logits, strict=True):
        _assert_logits(a, b)


def _greedy(model: Any, prompt: list[int], steps: int) -> tuple[list[int], list[Any]]:
    cache = make_prompt_cache(model)
    logits = model(mx.array([prompt]), cache=cache)[:, -1]
    tokens, all_logits = [], []
    for _ in range(steps):
        token = int(mx.argmax(logits, axis=-1).item())
        tokens.append(token)
        all_logits.append(logits)
        logits = model(mx.array([[token]]), cache=cache)[:, -1]
    return tokens, all_logits


@pytest.mark.parametrize("traditional", [False, True])
def test_greedy_generation(traditional: bool) -> None:
    stock, patched = _twins(scaling=KINDS["yarn"][3], traditional=traditional)
    prompt = [5, 17, 3, 88, 41, 2, 60]
    ours, our_logits = _greedy(patched, prompt, 16)
    theirs, their_logits = _greedy(stock, prompt, 16)
    assert ours == theirs
    assert len(set(theirs)) >= 4  # a walk through the vocabulary, not one token repeated
    for a, b in zip(our_logits, their_logits, strict=True):
        _assert_logits(a, b)
    # The rotation decides these tokens: pairing the features the other way changes them.
    for layer in patched.layers:
        rope = layer.self_attn.rope.rope
        flipped = anyrope.RoPE(
            rope.head_dim,
            base=rope.base,
            layout="half" if traditional else "interleaved",
            scaling=rope.scaling,
        )
        layer.self_attn.rope = am.AnyRoPE(flipped)
    assert _greedy(patched, prompt, 16)[0] != theirs


def test_batched_generation_with_left_padding(llama3_twins: tuple[llama.Model, llama.Model]) -> None:
    """BatchKVCache hands the rope one offset per row, negative for left-padded rows."""
    stock, patched = llama3_twins
    prompts = [[5, 17, 3, 88, 41, 2, 60], [9, 31, 7]]
    padding = [0, 4]
    batch = mx.array([[0] * pad + prompt for pad, prompt in zip(padding, prompts, strict=True)])
    results = []
    for model in (patched, stock):
        cache = [BatchKVCache(padding) for _ in model.layers]
        logits = model(batch, cache=cache)[:, -1]
        steps = [logits]
        for _ in range(4):
            logits = model(mx.argmax(logits, axis=-1)[:, None], cache=cache)[:, -1]
            steps.append(logits)
        assert isinstance(cache[0].offset, mx.array)  # per-row offsets reached the rope
        results.append(steps)
    for a, b in zip(*results, strict=True):
        _assert_logits(a, b)


def test_unpatch_model() -> None:
    stock, patched = _twins()
    assert am.unpatch_model(patched) == 2
    assert type(patched.model.layers[0].self_attn.rope) is nn.RoPE
    tokens = mx.array([[1, 2, 3, 4]])
    assert np.array_equal(np.array(patched(tokens)), np.array(stock(tokens)))


def test_shared_module_is_converted_once() -> None:
    shared = nn.RoPE(8)

    class Holder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = shared
            self.blocks = [{"rope": shared}, nn.Linear(2, 2)]

    holder = Holder()
    assert am.patch_model(holder) == 2
    assert holder.a is holder.blocks[0]["rope"]
    assert isinstance(holder.a, am.AnyRoPE)


# ----------------------------------------------------------------------------------------------
# Errors


class _Rotary(nn.Module):
    """A model-specific rope class: unknown to the drop-in."""

    def __call__(self, x: Any, offset: int = 0) -> Any:
        return mx.fast.rope(x, x.shape[-1], traditional=True, base=10000.0, scale=1.0, offset=offset)


class _SubRoPE(nn.RoPE):
    pass


def test_unknown_modules_are_refused() -> None:
    with pytest.raises(TypeError, match=r"no drop-in for .*Linear"):
        am.from_mlx_lm(nn.Linear(2, 2))
    with pytest.raises(TypeError, match="_SubRoPE"):
        am.from_mlx_lm(_SubRoPE(8))

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = [{"rope": nn.RoPE(8)}, {"rope": _Rotary()}]

    model = Model()
    with pytest.raises(ValueError, match=r"layers\.1\.rope .*_Rotary"):
        am.patch_model(model)
    assert type(model.layers[0]["rope"]) is nn.RoPE  # nothing replaced
    assert am.patch_model(model, strict=False) == 1
    assert isinstance(model.layers[0]["rope"], am.AnyRoPE)
    assert isinstance(model.layers[1]["rope"], _Rotary)


def test_no_rope_found() -> None:
    with pytest.raises(ValueError, match="holds no mlx-lm rope module"):
        am.patch_model(nn.Sequential(nn.Linear(2, 2)))
    assert am.patch_model(nn.Sequential(nn.Linear(2, 2)), strict=False) == 0
    with pytest.raises(TypeError, match=r"mlx\.nn\.Module"):
        am.patch_model({"rope": nn.RoPE(8)})


def test_failed_check_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        importlib.import_module("anyrope.integrations.mlx_lm._conversion"),
        "_convert",
        lambda module: anyrope.RoPE(module.dims, base=module.base, layout="interleaved"),
    )
    with pytest.raises(ValueError, match="rotates differently from mlx-lm's RoPE"):
        am.from_mlx_lm(nn.RoPE(16, traditional=False))
    assert isinstance(am.from_mlx_lm(nn.RoPE(16), check=False), am.AnyRoPE)


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((HEAD, 1e4, False, {"rope_type": "ntk"}), ValueError, "Unsupported RoPE type 'ntk'"),
        ((HEAD, 1e4, False, {"rope_type": "llama3"}), ValueError, "'factor'"),
        (
            (HEAD, 1e4, False, {"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG}),
            ValueError,
            "max_position_embeddings",
        ),
        (
            (
                HEAD,
                1e4,
                False,
                {
                    "rope_type": "longrope",
                    "short_factor": SHORT,
                    "long_factor": LONG[:3],
                    "original_max_position_embeddings": 4096,
                },
                131072,
            ),
            ValueError,
            "long_factor",
        ),
        ((HEAD, 1e4, False, {"rope_type": "mrope", "mrope_section": [16, 16]}), ValueError, "3 sections"),
        ((HEAD, 1e4, False, [("rope_type", "linear")]), TypeError, "scaling_config"),
        ((HEAD, 1e4, False, {"rope_type": "yarn", "factor": "4"}), TypeError, "factor"),
        ((63, 1e4, False, None), ValueError, "even"),
    ],
)
def test_initialize_rope_errors(args: tuple[Any, ...], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        am.initialize_rope(*args)


def test_call_errors() -> None:
    rope = am.initialize_rope(32, 1e4, False)
    with pytest.raises(ValueError, match="fewer than the 32"):
        rope(_input(width=16))
    with pytest.raises(TypeError, match="offset"):
        rope(_input(width=32), offset=1.5)
    with pytest.raises(ValueError, match="rows"):
        rope(_input(width=32), offset=mx.array([1, 2, 3]))
    with pytest.raises(TypeError, match="scale"):
        rope(_input(width=32), scale=mx.array(2.0))
    with pytest.raises(ValueError, match="seq, head_dim"):
        rope(mx.zeros((32,)))
    with pytest.raises(TypeError, match=r"anyrope\.RoPE"):
        am.AnyRoPE(nn.RoPE(8))  # type: ignore[arg-type]
    dynamic = am.initialize_rope(*KINDS["dynamic"])
    with pytest.raises(ValueError, match="DynamicNTK"):
        dynamic(_input(), inverse=True)
