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

import inspect
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from anyrope._families import FAMILIES, Family

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", minversion="5.0")

from peers.tiny_models import NOT_IN_MODEL, OVERRIDES, tiny_model

from anyrope.integrations.transformers import is_patched, remove_anyrope, use_anyrope

SUPPORTED = [f for f in FAMILIES if f.unsupported is None]

PROMPT = 8
PAD = 3  # left padding of row 1
NEW_TOKENS = 16

# transformers forms the angles in float32, inv_freq * position, off by up to |angle| * 2**-24
# (1.4e-6 rad at position 23 and frequency 1; its float32 inv_freq adds about as much), and
# anyrope forms them exactly: cos and sin differ by ~1e-6. Through these 2-layer random models
# (initializer_range 0.1, attention scores of order 1) that becomes, measured over every family
# here, at most 9.6e-7 of the logits' scale in the forward (median 4e-7) and 1.1e-6 in the 16
# decoding steps (positions up to 23). The bound leaves 10x room; a 1% frequency error moves the
# same outputs by 1.3e-4 or more (a wrong pairing, width or position by O(1e-2..1)), and the
# smallest greedy top-2 margin of the stock runs is 2.3e-4.
LOGITS_RTOL = 1e-5


def _accepts(model: torch.nn.Module, name: str) -> bool:
    return name in inspect.signature(model.forward).parameters


def _main_output(out: Any) -> torch.Tensor:
    logits = getattr(out, "logits", None)
    return logits if logits is not None else out.last_hidden_state


class Run:
    """One family's tiny model, its inputs, and the forwards and decodes the test compares."""

    def __init__(self, family: Family) -> None:
        self.model_type = family.model_type
        self.overrides = OVERRIDES.get(family.model_type, {})
        self.model = tiny_model(family.model_type)
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

    def _tokens(self, ids: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.overrides.get("_inputs_embeds"):
            return {"inputs_embeds": self.embeddings[ids]}
        return {"input_ids": ids}

    def _encoder_inputs(self) -> dict[str, torch.Tensor]:
        if self.input_values is not None:
            return {"input_values": self.input_values}
        return {**self._tokens(self.ids), "attention_mask": self.mask}

    def _kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {**self._encoder_inputs(), **self.extra}
        if self.seq2seq:
            decoder_ids = self.fixed[:, :PROMPT]
            if "_decoder_channels" in self.overrides:  # Dia: audio codes, (batch, length, channels)
                decoder_ids = decoder_ids[..., None].repeat(1, 1, self.overrides["_decoder_channels"])
            kwargs["decoder_input_ids"] = decoder_ids
        elif _accepts(self.model, "position_ids"):
            kwargs["position_ids"] = self.position_ids
        if not self.use_cache:
            kwargs["use_cache"] = False
        return kwargs

    def forward(self) -> torch.Tensor:
        out = _main_output(self.model(**self._kwargs()))
        if self.seq2seq:
            return out
        # The padded positions' outputs are not compared (CSM's depth decoder drops position 0).
        return out[self.mask[:, -out.shape[1] :].bool()]

    def generates(self) -> bool:
        return self.model.can_generate() and self.overrides.get("_generate", True)

    def decode(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(16 greedy tokens or None, each step's scores or outputs); (None, None): no decoding."""
        if self.generates():
            return self._generate()
        if self.seq2seq or not self.use_cache or not _accepts(self.model, "past_key_values"):
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
        assert len(out.scores) == NEW_TOKENS, (
            f"{self.model_type}: generate stopped after {len(out.scores)} steps"
        )
        return out.sequences[:, -NEW_TOKENS:], torch.stack(out.scores, dim=1)

    def _decode_by_hand(self) -> tuple[torch.Tensor | None, torch.Tensor]:
        """generate's loop: the prompt, then one token at a time on the KV cache.

        Greedy tokens where the model has logits, the fixed random ones for hidden-state models.
        """
        out = self.model(**self._kwargs(), use_cache=True)
        if out.get("past_key_values") is None:
            return None, None  # a text model that makes no cache of its own (Granite 4 Vision's)
        has_logits = out.get("logits") is not None
        mask, position = self.mask, self.position_ids[:, -1:]
        tokens, steps = [], []
        for step in range(NEW_TOKENS):
            last = _main_output(out)[:, -1]
            token = last.argmax(-1, keepdim=True) if has_logits else self.fixed[:, step : step + 1]
            tokens.append(token)
            mask = torch.cat((mask, torch.ones_like(token)), dim=-1)
            position = position + 1
            kwargs = {**self._tokens(token), **self.extra, "attention_mask": mask}
            if _accepts(self.model, "position_ids"):
                kwargs["position_ids"] = position
            if _accepts(self.model, "logits_to_keep"):
                kwargs["logits_to_keep"] = 1  # as generate passes it (CSM's depth decoder needs it)
            out = self.model(**kwargs, past_key_values=out.past_key_values, use_cache=True)
            steps.append(_main_output(out)[:, -1])
        return (torch.cat(tokens, dim=-1) if has_logits else None), torch.stack(steps, dim=1)


def _relative(stock: torch.Tensor, patched: torch.Tensor) -> float:
    """The largest difference, relative to the stock values' scale (floored at 1)."""
    return float((stock - patched).abs().max()) / max(float(stock.abs().max()), 1.0)


def _margin(scores: torch.Tensor) -> float:
    """The smallest lead of a greedy pick over the runner-up; a fully masked (forced) step has none."""
    top = scores.float().topk(2, dim=-1).values
    lead = (top[..., 0] - top[..., 1]).nan_to_num(nan=float("inf"))
    return float(torch.where(torch.isfinite(top[..., 0]), lead, float("inf")).min())


@pytest.fixture(autouse=True)
def _quiet_and_fast() -> Iterator[None]:
    # One intra-op thread: the matrices are tiny, and a second thread that spins waiting for work
    # makes each op ~10x slower on a busy 2-core machine.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' notes on tiny random configs
        yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("family", SUPPORTED, ids=[f.model_type for f in SUPPORTED])
def test_family_in_model(family: Family) -> None:
    if family.model_type in NOT_IN_MODEL:
        pytest.skip(NOT_IN_MODEL[family.model_type])
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

    rel = _relative(stock, patched)
    assert rel <= LOGITS_RTOL, f"{name}: outputs differ by {rel:.2e} of their scale, over {LOGITS_RTOL:.0e}"
    if stock_tokens is not None:
        assert stock_steps is not None
        assert patched_steps is not None
        margin = _margin(stock_steps)
        scale = max(float(stock_steps[torch.isfinite(stock_steps)].abs().max()), 1.0)
        assert margin > LOGITS_RTOL * scale, (
            f"{name}: a greedy step's top-2 margin ({margin:.2e}) is within the logits tolerance, so "
            "a differing token would be a tie: choose another seed (OVERRIDES '_seed')"
        )
        # The picks from the scores too: Higgs generates audio codebooks, with scores per codebook.
        assert torch.equal(stock_steps.argmax(-1), patched_steps.argmax(-1)), (
            f"{name}: greedy picks differ (smallest top-2 margin of the stock run {margin:.2e})"
        )
        assert torch.equal(stock_tokens, patched_tokens), (
            f"{name}: greedy tokens differ (smallest top-2 margin of the stock run {margin:.2e})\n"
            f"stock   {stock_tokens.tolist()}\npatched {patched_tokens.tolist()}"
        )
    elif stock_steps is not None:
        assert patched_steps is not None
        rel = _relative(stock_steps, patched_steps)
        assert rel <= LOGITS_RTOL, f"{name}: cached decoding steps differ by {rel:.2e} of their scale"
    assert torch.equal(stock, restored), (
        f"{name}: remove_anyrope did not restore the stock outputs bit for bit"
    )
