"""Greedy decoding on the KV cache after an image, in vision-language models, through ``use_anyrope``.

test_vision_towers.py checks one forward of each whole vision-language model of its ``IN_MODEL``
(tiny, random, built by its ``_vision_language_model``, on its ``_inputs``: 5 text tokens around a
2 x 3 image after the merge). This file runs ``generate`` on the same model and prompt: 8 greedy
tokens on the KV cache, stock and after ``use_anyrope(model)`` (text and vision towers patched).

The decoding steps are the point. Qwen2-VL's M-RoPE gives the image's tokens one time position and
height / width positions by row and column, so the prompt's 13 tokens end at position 9, and
``generate`` puts each decoded token at the prompt's last position plus one per step (10, 11, ...;
``rope_deltas`` = -3), not at the token count (13, 14, ...). The test checks that premise on the
positions handed to the text rotary module, then:

* the sensitivity of the check: the stock model with its decoding positions at the token count
  (the image's position deltas dropped), or one position later, moves the first decoding step's
  logits (same token, same cache: only its position differs) by more than 10x the tolerance
  (measured: by 4.7e-2 of their scale or more, the least glm4v_moe one position later);
* stock and patched: the same greedy picks and tokens, no stock pick a near-tie within the
  tolerance (in_model.py's ``assert_same_greedy``), and every step's logits within in_model.py's
  ``LOGITS_RTOL`` of their scale. Both runs form float32 angles from positions below 17 (text) and
  6 (vision), off by under 17 * 2**-24 rad, which moves these logits by at most 1.2e-6 of their
  scale (measured over the ten models; the smallest stock top-2 margin is 7.7e-4, glm_ocr's): the
  tolerance leaves about 8x room;
* ``remove_anyrope``: the stock tokens and logits again, bit for bit.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", minversion="5.0")

from peers.in_model import (  # noqa: F401 - quiet_and_fast: an autouse fixture, one thread, no grad
    LOGITS_RTOL,
    assert_same_greedy,
    quiet_and_fast,
    relative,
)
from peers.test_vision_towers import IN_MODEL, _inputs, _vision_language_model

from anyrope.integrations.transformers import is_patched, remove_anyrope, use_anyrope

NEW_TOKENS = 8
SENSITIVITY = 10  # a wrong decoding position must move the step logits by this many tolerances


@contextmanager
def decoding_positions(rotary: torch.nn.Module, shift: int = 0) -> Iterator[list[torch.Tensor]]:
    """Records the position ids handed to ``rotary`` and moves those of decoding steps (one token)
    by ``shift``; GLM-4V's and GLM-OCR's models pass them by keyword, the others by position."""
    seen: list[torch.Tensor] = []

    def hook(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        by_keyword = "position_ids" in kwargs
        position_ids = kwargs["position_ids"] if by_keyword else args[1]
        seen.append(position_ids.clone())
        if shift and position_ids.shape[-1] == 1:
            position_ids = position_ids + shift
        if by_keyword:
            return args, {**kwargs, "position_ids": position_ids}
        return (args[0], position_ids, *args[2:]), kwargs

    handle = rotary.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield seen
    finally:
        handle.remove()


def _generate(model: torch.nn.Module, inputs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """The greedy tokens and each step's logits, (batch, steps, vocab): step 0 from the prompt."""
    out = model.generate(
        **inputs,
        max_new_tokens=NEW_TOKENS,
        do_sample=False,
        pad_token_id=0,
        output_logits=True,
        return_dict_in_generate=True,
    )
    assert len(out.logits) == NEW_TOKENS, f"generate stopped after {len(out.logits)} steps"
    return out.sequences[:, -NEW_TOKENS:], torch.stack(out.logits, dim=1)


@pytest.mark.parametrize("model_type", IN_MODEL)
def test_greedy_decoding_after_an_image(model_type: str) -> None:
    model = _vision_language_model(model_type)
    inputs = _inputs(model)
    model.generation_config.eos_token_id = None  # all the steps, whatever the tokens
    rotary = model.model.language_model.rotary_emb
    tower = getattr(model.model, "visual", None) or model.model.vision_tower  # ERNIE 4.5-VL: vision_tower

    with decoding_positions(rotary) as seen:
        stock_tokens, stock_logits = _generate(model, inputs)

    # The premise: the decoded tokens continue from the image's largest position, not the count.
    prompt, steps = seen[0], torch.cat(seen[1:], dim=-1)
    length = inputs["input_ids"].shape[-1]
    assert prompt.shape[-1] == length, f"{model_type}: the first forward is not the whole prompt"
    following = int(prompt.max()) + 1 + torch.arange(NEW_TOKENS - 1)
    assert torch.equal(steps, following.expand_as(steps)), (
        f"{model_type}: decoding positions {steps.tolist()}, not {following.tolist()} on every stream"
    )
    assert following[0] < length, f"{model_type}: the image does not move the decoding positions"

    # A wrong decoding position shows: the first decoding step has the same token and cache, and
    # only its position differs.
    for what, shift in {"the token count": length - int(following[0]), "one position later": 1}.items():
        with decoding_positions(rotary, shift):
            _, logits = _generate(model, inputs)
        moved = relative(stock_logits[:, 1], logits[:, 1])
        assert moved > SENSITIVITY * LOGITS_RTOL, (
            f"{model_type}: decoding at {what} moves the step logits by only {moved:.2e} of their "
            "scale: the test could not tell a wrong decoding position"
        )

    use_anyrope(model)
    assert is_patched(rotary)
    assert is_patched(tower.rotary_pos_emb)
    patched_tokens, patched_logits = _generate(model, inputs)
    remove_anyrope(model)
    restored_tokens, restored_logits = _generate(model, inputs)

    assert_same_greedy(model_type, stock_logits, stock_tokens, patched_logits, patched_tokens)
    rel = relative(stock_logits, patched_logits)
    assert rel <= LOGITS_RTOL, f"{model_type}: step logits differ by {rel:.2e} of their scale"
    assert torch.equal(restored_tokens, stock_tokens), f"{model_type}: remove_anyrope did not restore"
    assert torch.equal(restored_logits, stock_logits), f"{model_type}: remove_anyrope did not restore"
