"""Every model family anyrope supports, in its own transformers model, rotating with anyrope.

For each supported family (``anyrope._families.FAMILIES``, no ``unsupported`` reason), a tiny
random-weight model of the family's own classes (``tiny_models.tiny_model``) runs a batch of two
rows, the second left-padded so the rows' position ids differ, formed as transformers'
``generate`` forms them (text positions, of shape (batch, seq): M-RoPE models give every stream
the same; test_mrope_models.py runs them at image-like positions):

* stock logits (hidden states for models without a head), then
  ``use_anyrope(model)`` and the same forward: equal within float32 rounding of the angles;
* 16 greedy tokens on the KV cache, stock and patched: the same token ids. ``generate`` where
  the model generates text tokens; otherwise the same loop by hand (prompt, then one token at a
  time on the cache), comparing each step's output;
* ``remove_anyrope(model)``: the stock logits again, bit for bit.

Encoders run the forward only; encoder-decoders run the decoder on a fixed prompt and generate.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

import anyrope
from anyrope._families import FAMILIES, Family

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", minversion="5.0")

from peers.in_model import (  # noqa: F401 - quiet_and_fast: an autouse fixture, one thread, no grad
    LOGITS_RTOL,
    NEW_TOKENS,
    InModel,
    assert_same_greedy,
    main_output,
    quiet_and_fast,
    relative,
)
from peers.tiny_models import NOT_IN_MODEL, tiny_model

from anyrope.integrations.transformers import is_patched, remove_anyrope, use_anyrope

SUPPORTED = [f for f in FAMILIES if f.unsupported is None]

PROMPT = 8
PAD = 3  # left padding of row 1


class Run(InModel):
    """One family's tiny model, its inputs, and the forwards and decodes the test compares."""

    def __init__(self, family: Family) -> None:
        super().__init__(family)
        config = self.model.config
        self.seq2seq = bool(getattr(config, "is_encoder_decoder", False))
        self.use_cache = self.overrides.get("_use_cache", True)
        text = config.get_text_config(decoder=True)
        vocab = min(getattr(text, "vocab_size", None) or 128, 128)
        generator = torch.Generator().manual_seed(self.overrides.get("_seed", 1))
        self.ids = torch.randint(3, vocab, (2, PROMPT), generator=generator)
        self.mask = torch.ones_like(self.ids)
        self.mask[1, :PAD] = 0
        self.ids[1, :PAD] = 0
        self.position_ids = (self.mask.cumsum(-1) - 1).clamp(min=0)  # as generate forms them
        self.fixed = torch.randint(3, vocab, (2, NEW_TOKENS), generator=generator)
        # Fixed random inputs for models that take embeddings or extra tensors, not token ids.
        if self.overrides.get("_inputs_embeds"):
            self.embeddings = torch.randn(vocab, text.hidden_size, generator=generator)
        self.extra = {
            name: torch.randn(shape, generator=generator)
            for name, shape in self.overrides.get("_extra", {}).items()
        }
        self.input_values = (
            torch.randn(2, self.overrides["_input_values"], generator=generator)
            if "_input_values" in self.overrides
            else None
        )
        self.input_features = (
            torch.randn(2, *self.overrides["_input_features"], generator=generator)
            if "_input_features" in self.overrides
            else None
        )

    def _encoder_inputs(self) -> dict[str, torch.Tensor]:
        if self.input_values is not None:
            return {"input_values": self.input_values}
        if self.input_features is not None:
            return {"input_features": self.input_features}
        return {**self.tokens(self.ids), "attention_mask": self.mask}

    def _kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {**self._encoder_inputs(), **self.extra}
        if self.seq2seq:
            decoder_ids = self.fixed[:, :PROMPT]
            if "_decoder_channels" in self.overrides:  # Dia: audio codes, (batch, length, channels)
                decoder_ids = decoder_ids[..., None].repeat(1, 1, self.overrides["_decoder_channels"])
            kwargs["decoder_input_ids"] = decoder_ids
        elif self.accepts("position_ids"):
            kwargs["position_ids"] = self.position_ids
        if not self.use_cache:
            kwargs["use_cache"] = False
        return kwargs

    def forward(self) -> torch.Tensor:
        out = main_output(self.model(**self._kwargs()))
        if self.seq2seq or self.input_values is not None or self.input_features is not None:
            return out  # (audio inputs have no padding)
        # The padded positions' outputs are not compared (CSM's depth decoder drops position 0).
        return out[self.mask[:, -out.shape[1] :].bool()]

    def generates(self) -> bool:
        return self.model.can_generate() and self.overrides.get("_generate", True)

    def decode(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(16 greedy tokens or None, each step's scores or outputs); (None, None): no decoding."""
        if self.generates():
            return self._generate()
        if self.seq2seq or not self.use_cache or not self.accepts("past_key_values"):
            return None, None  # encoders; encoder-decoders and models run without cache: forward only
        return self._decode_by_hand()

    def _generate(self) -> tuple[torch.Tensor, torch.Tensor]:
        self.model.generation_config.eos_token_id = None  # all 16 steps, whatever the tokens
        out = self.model.generate(
            **self._encoder_inputs(),
            **self.extra,
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            pad_token_id=0,
            use_cache=self.use_cache,
            output_scores=True,
            return_dict_in_generate=True,
        )
        assert len(out.scores) == NEW_TOKENS, f"{self.name}: generate stopped after {len(out.scores)} steps"
        return out.sequences[:, -NEW_TOKENS:], torch.stack(out.scores, dim=1)

    def _decode_by_hand(self) -> tuple[torch.Tensor | None, torch.Tensor]:
        """generate's loop: the prompt, then one token at a time on the KV cache.

        Greedy tokens where the model has logits, the fixed random ones for hidden-state models.
        """
        out = self.model(**self._kwargs(), use_cache=True)
        if out.get("past_key_values") is None:
            return None, None  # a text model that makes no cache of its own (Granite 4 Vision's)
        has_logits = out.get("logits") is not None
        last = self.position_ids[:, -1:]

        def pick(out: Any, step: int) -> torch.Tensor:
            if has_logits:
                return main_output(out)[:, -1].argmax(-1, keepdim=True)
            return self.fixed[:, step : step + 1]

        def step_inputs(token: torch.Tensor, step: int) -> dict[str, Any]:
            kwargs = {**self.tokens(token), **self.extra}
            if self.accepts("position_ids"):
                kwargs["position_ids"] = last + (step + 1)
            if self.accepts("logits_to_keep"):
                kwargs["logits_to_keep"] = 1  # as generate passes it (CSM's depth decoder needs it)
            return kwargs

        tokens, outs = self.greedy(out, self.mask, pick, step_inputs)
        steps = torch.stack([main_output(o)[:, -1] for o in outs], dim=1)
        return (torch.cat(tokens, dim=-1) if has_logits else None), steps


@pytest.mark.parametrize("family", SUPPORTED, ids=[f.model_type for f in SUPPORTED])
def test_family_in_model(family: Family) -> None:
    if family.model_type in NOT_IN_MODEL:
        pytest.skip(NOT_IN_MODEL[family.model_type])
    _check_in_model(family)


@pytest.mark.parametrize("model_type", ["gemma3n_text", "gemma4_text", "mistral_large4_text"])
def test_kv_shared_layers_rotate_q_only(model_type: str) -> None:
    """Gemma 3n's and Gemma 4's last num_kv_shared_layers layers, and Mistral Large 4's layers
    whose kv_source_layers entry is an earlier layer, rotate their queries only and attend to
    the keys that layer rotated and stored: the same outputs and greedy tokens under anyrope."""
    family = next(f for f in FAMILIES if f.model_type == model_type)
    variant = model_type.removesuffix("_text") + "_kv_shared"
    run = _check_in_model(dataclasses.replace(family, model_type=variant))
    modes = run.model.config.kv_sharing_modes
    # the variant does share keys (Mistral Large 4's sharing layers still run their own indexer)
    assert any(mode in ("reuse", "reuse_but_indexer") for mode in modes), modes
    assert "store" in modes, modes


def _check_in_model(family: Family) -> Run:
    name = family.model_type
    run = Run(family)
    stock = run.forward()
    stock_tokens, stock_steps = run.decode()

    use_anyrope(run.model)
    assert any(is_patched(module) for module in run.model.modules()), f"{name}: use_anyrope patched nothing"
    patched = run.forward()
    patched_tokens, patched_steps = run.decode()

    remove_anyrope(run.model)
    assert not any(is_patched(module) for module in run.model.modules()), f"{name}: still patched"
    restored = run.forward()

    rel = relative(stock, patched)
    assert rel <= LOGITS_RTOL, f"{name}: outputs differ by {rel:.2e} of their scale, over {LOGITS_RTOL:.0e}"
    if stock_tokens is not None:
        assert stock_steps is not None
        assert patched_steps is not None
        assert patched_tokens is not None
        assert_same_greedy(name, stock_steps, stock_tokens, patched_steps, patched_tokens)
    elif stock_steps is not None:
        assert patched_steps is not None
        rel = relative(stock_steps, patched_steps)
        assert rel <= LOGITS_RTOL, f"{name}: cached decoding steps differ by {rel:.2e} of their scale"
    assert torch.equal(stock, restored), (
        f"{name}: remove_anyrope did not restore the stock outputs bit for bit"
    )
    return run


@pytest.mark.parametrize("model_type", ["lara_mini", "dory"])
def test_layers_rotate_as_in_the_model(model_type: str) -> None:
    """``layers_from_hf_config`` of the model's config, and of its saved form (``to_dict()``:
    Dory's lists an "mlp" block after every layer), against the tables each layer's attention is
    handed: None for LARA-mini's full-attention (NoPE) and linear-attention layers, and Dory's
    per-layer-type thetas."""
    model = tiny_model(model_type)
    handed: dict[int, Any] = {}

    def record(index: int) -> Any:
        def hook(_module: Any, _args: Any, kwargs: dict[str, Any]) -> None:
            handed.setdefault(index, kwargs["position_embeddings"])

        return hook

    for index, layer in enumerate(model.model.layers):
        attention = getattr(layer, "self_attn", None)
        if attention is not None:
            attention.register_forward_pre_hook(record(index), with_kwargs=True)
    positions = torch.tensor([[0, 1, 2, 3, 500, 501]])
    model(torch.arange(3, 9)[None], position_ids=positions)
    count = len(model.model.layers)
    for config in (model.config, model.config.to_dict()):
        ropes = anyrope.RoPE.layers_from_hf_config(config)
        assert [rope is not None for rope in ropes] == [handed.get(i) is not None for i in range(count)]
        for index, rope in enumerate(ropes):
            if rope is None:
                continue
            cos, sin = rope.cos_sin(positions, like=handed[index][0])
            for ours, theirs in zip((cos, sin), handed[index], strict=True):
                # float32 angles at position 501: off by up to 501 * 2**-24 = 3e-5 rad
                torch.testing.assert_close(torch.cat((ours, ours), -1), theirs, rtol=0, atol=1e-4)
