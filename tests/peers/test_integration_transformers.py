"""anyrope.integrations.transformers on tiny transformers models: what it patches, what it refuses.

Every family is run through it in test_families.py; this file covers the integration's own
promises: undo, idempotence, compiled models and compiled generation, length-dependent scaling
past the trained length, the sin/cos-table families, and refusals that change nothing.
"""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", minversion="5.0")

from anyrope.integrations.transformers import is_patched, remove_anyrope, use_anyrope

# Logits of a 2-layer float32 model whose tables differ by float32 rounding of the angles
# (transformers' angles are float32 products, off by up to |angle| * 2**-24; cos and sin are then
# rounded alike): the differences stay within a few float32 ulps of logits of order 1.
LOGITS_ATOL = 1e-5

TINY = {
    "hidden_size": 64,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 128,
    "max_position_embeddings": 256,
}


def _llama(**rope: object) -> object:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**TINY, **rope)
    return transformers.LlamaForCausalLM(config).eval()


def _batch() -> tuple[object, object]:
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 128, (2, 8), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # a left-padded row: position ids differ per row
    return ids, mask


def _logits(model: object, ids: object, mask: object) -> object:
    with torch.no_grad():
        return model(ids, attention_mask=mask).logits


def _generate(model: object, ids: object, mask: object) -> object:
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False, pad_token_id=0)


@pytest.mark.parametrize(
    "rope",
    [
        {},
        {"rope_scaling": {"rope_type": "linear", "factor": 2.0}},
        {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
        {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}},
        {
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            }
        },
    ],
    ids=["default", "linear", "dynamic", "yarn", "llama3"],
)
def test_patch_matches_and_undoes(rope: dict) -> None:
    model = _llama(**rope)
    ids, mask = _batch()
    stock = _logits(model, ids, mask)
    stock_tokens = _generate(model, ids, mask)
    assert use_anyrope(model) is model
    assert is_patched(model.model.rotary_emb)
    torch.testing.assert_close(_logits(model, ids, mask), stock, rtol=0, atol=LOGITS_ATOL)
    assert torch.equal(_generate(model, ids, mask), stock_tokens)
    use_anyrope(model)  # twice: harmless
    assert remove_anyrope(model) is model
    assert not is_patched(model.model.rotary_emb)
    assert torch.equal(_logits(model, ids, mask), stock)


@pytest.mark.parametrize("rope_type", ["dynamic", "longrope"])
def test_length_dependent_scaling_past_the_trained_length(rope_type: str) -> None:
    """DynamicNTK and LongRoPE switch frequencies on the device when positions pass the threshold."""
    scaling = {"rope_type": rope_type, "factor": 4.0}
    if rope_type == "longrope":
        scaling |= {
            "short_factor": [1.0] * 8,
            "long_factor": [4.0] * 8,
            "original_max_position_embeddings": 64,
        }
    model = _llama(rope_scaling=scaling)
    ids = torch.randint(3, 128, (1, 300), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    stock = _logits(model, ids, mask)
    use_anyrope(model)
    # angles near position 300 differ by up to 300 * 2**-24 in float32: still far below 1e-5
    torch.testing.assert_close(_logits(model, ids, mask), stock, rtol=0, atol=LOGITS_ATOL)


def test_compiled_model_and_compiled_generate() -> None:
    model = _llama(rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    ids, mask = _batch()
    stock = _logits(model, ids, mask)
    stock_tokens = _generate(model, ids, mask)
    use_anyrope(model)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    torch.testing.assert_close(_logits(compiled, ids, mask), stock, rtol=0, atol=LOGITS_ATOL)
    model.forward = torch.compile(model.forward, fullgraph=True, dynamic=True)
    try:
        assert torch.equal(_generate(model, ids, mask), stock_tokens)
    finally:
        del model.forward


@pytest.mark.parametrize("model_type", ["gptj", "codegen"])
def test_sin_cos_table_families(model_type: str) -> None:
    torch.manual_seed(0)
    names = {"n_embd": 64, "n_layer": 2, "n_head": 4, "rotary_dim": 8, "vocab_size": 128, "n_positions": 256}
    config = transformers.CONFIG_MAPPING[model_type](**names)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    # transformers 5.24 moved the sinusoid table into a rotary module returning (sin, cos), one
    # column per pair: use_anyrope patches that module's forward and leaves its table alone
    rotary = model.transformer.rotary_emb
    before = rotary.embed_positions.clone()
    ids, mask = _batch()
    stock = _logits(model, ids, mask)
    stock_tokens = _generate(model, ids, mask)
    use_anyrope(model)
    assert is_patched(rotary)
    assert torch.equal(rotary.embed_positions, before)
    torch.testing.assert_close(_logits(model, ids, mask), stock, rtol=0, atol=LOGITS_ATOL)
    assert torch.equal(_generate(model, ids, mask), stock_tokens)
    # past the stock table's 256 rows: anyrope's angles, (sin, cos) of rotary_dim / 2 columns
    x = torch.zeros(1, 1, 64, dtype=torch.bfloat16)
    sin, cos = rotary(x, torch.tensor([[300, 1000]]))
    exponents = -torch.arange(4, dtype=torch.float64) / 4
    angles = torch.tensor([300.0, 1000.0], dtype=torch.float64)[:, None] * 10000.0**exponents
    want = {"cos": angles.cos(), "sin": angles.sin()}
    expected_dtype = torch.float32 if model_type == "codegen" else torch.bfloat16  # CodeGen keeps float32
    for name, table in (("sin", sin), ("cos", cos)):
        assert table.dtype == expected_dtype
        assert table.shape == (1, 2, 4)
        # exact angles rounded once: |value| <= 1, bfloat16 within 2**-8, float32 within 2**-24
        tolerance = 2**-8 if table.dtype == torch.bfloat16 else 2**-23
        torch.testing.assert_close(table[0].double(), want[name], rtol=0, atol=tolerance)
    remove_anyrope(model)
    assert not is_patched(rotary)
    torch.testing.assert_close(_logits(model, ids, mask), stock, rtol=0, atol=0)


def test_refuses_a_model_without_rotary() -> None:
    config = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64)
    with pytest.raises(ValueError, match="no rotary embedding module"):
        use_anyrope(transformers.GPT2LMHeadModel(config))
    with pytest.raises(TypeError, match=r"torch\.nn\.Module"):
        use_anyrope(config)


def test_refuses_a_family_it_cannot_express_and_patches_nothing() -> None:
    config = transformers.HunYuanVLTextConfig(
        **TINY,
        head_dim=16,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 2, 2, 2]},
    )
    model = transformers.AutoModel.from_config(config)
    with pytest.raises(ValueError, match="different position streams"):
        use_anyrope(model)
    assert not any(is_patched(m) for m in model.modules())


def test_learned_frequency_scale_is_read_at_patch_time() -> None:
    """Mistral Large 4's rotary module scales its frequencies by exp(alpha), a weight: the patched
    module turns by the alpha it had when patched, and says so when alpha could still train."""
    from peers.tiny_models import tiny_model

    model = tiny_model("mistral_large4_text")  # alpha drawn away from its init of 0
    rotary = next(m for name, m in model.named_modules() if name.endswith("rotary_emb"))
    use_anyrope(model)
    (rope,) = rotary._anyrope_rotary.ropes.values()
    want = tuple(float(v) for v in rotary.alpha.detach().double().exp())
    assert rope.frequency_scale == want
    assert len(set(want)) > 1
    remove_anyrope(model)
    model.train()
    with pytest.warns(UserWarning, match=r"rotary_emb\.alpha once, now: training it changes nothing"):
        use_anyrope(model)
    remove_anyrope(model)
    rotary.alpha.requires_grad_(False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # frozen: nothing to say
        use_anyrope(model)


def test_m_rope_model_takes_text_and_image_positions() -> None:
    """A Qwen2-VL text model, patched: (batch, seq) text positions and (3, batch, seq) ones."""
    config = transformers.Qwen2VLTextConfig(
        **TINY, rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]}
    )
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(config).eval()
    ids = torch.randint(3, 128, (2, 7), generator=torch.Generator().manual_seed(1))
    grid = torch.tensor([[0, 1, 2, 2, 2, 2, 4], [0, 1, 2, 2, 3, 3, 4], [0, 1, 2, 3, 2, 3, 4]])
    inputs = [None, torch.arange(7).expand(2, 7), grid[:, None, :].expand(3, 2, 7)]
    with torch.no_grad():
        stock = [model(ids, position_ids=p).last_hidden_state for p in inputs]
        use_anyrope(model)
        patched = [model(ids, position_ids=p).last_hidden_state for p in inputs]
    for before, after in zip(stock, patched, strict=True):
        torch.testing.assert_close(after, before, rtol=0, atol=LOGITS_ATOL)
    assert float((stock[2] - stock[1]).abs().max()) > 100 * LOGITS_ATOL  # the image positions matter


def test_refuses_a_module_whose_tables_differ_and_patches_nothing() -> None:
    model = _llama()
    model.config.rope_parameters["rope_theta"] = 500000.0  # the config no longer says what the module does
    with pytest.raises(ValueError, match="other tables than anyrope's"):
        use_anyrope(model)
    assert not is_patched(model.model.rotary_emb)


def test_speech_conformer_tables() -> None:
    """Wav2Vec2-Conformer's rotary module returns stack([cos, sin]) of positions 0 .. seq - 1, in
    hidden_states' dtype, cached by length: patched, it returns anyrope's tables at every length
    and dtype, and neither reads nor writes that cache (the probe runs on a copy)."""
    from peers.tiny_models import tiny_model

    model = tiny_model("wav2vec2-conformer")  # rotary_embedding_base 500, heads of 16 features
    rotary = model.encoder.embed_positions
    with torch.no_grad():
        cached = rotary(torch.zeros(1, 10, 64))
    use_anyrope(model)
    assert is_patched(rotary)
    rotary.cached_rotary_positional_embedding = torch.full_like(cached, float("nan"))  # stale
    inv_freq = 500.0 ** (-torch.arange(0, 16, 2, dtype=torch.float64) / 16)
    fresh = type(rotary)(model.config)  # a stock module with no cache yet, for the dtype
    for length, dtype in ((10, torch.float32), (70, torch.bfloat16), (10, torch.float64)):
        x = torch.zeros(1, length, 64, dtype=dtype)
        with torch.no_grad():
            tables = rotary(x)
            assert tables.dtype == type(fresh).forward(fresh, x).dtype == dtype
        angles = torch.arange(length, dtype=torch.float64)[:, None] * inv_freq
        want = torch.stack((angles.cos(), angles.sin())).repeat(1, 1, 2)[:, :, None, None]
        # exact angles rounded once: bfloat16 within 2**-8, float32 within 2**-24, float64 exact
        tolerance = {torch.bfloat16: 2**-8, torch.float32: 2**-24, torch.float64: 1e-15}[dtype]
        torch.testing.assert_close(tables.double(), want, rtol=0, atol=tolerance)
    assert rotary.cached_sequence_length == 10
    rotary.cached_rotary_positional_embedding = cached
    remove_anyrope(model)
    assert not is_patched(rotary)
    with torch.no_grad():
        assert rotary(torch.zeros(1, 10, 64)) is cached  # the stock module, on its own cache
