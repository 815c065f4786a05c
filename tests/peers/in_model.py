"""The in-model harness of test_families.py and test_mrope_models.py.

A family's tiny random-weight model (``tiny_models.tiny_model``) with the ``OVERRIDES`` that say
how it takes its tokens, transformers' greedy decoding loop run by hand on the KV cache, and how
stock and patched outputs are compared. Each test file forms its own positions and inputs.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from peers.tiny_models import OVERRIDES, tiny_model

from anyrope._families import Family

# transformers forms the angles in float32, inv_freq * position, off by up to |angle| * 2**-24
# (1.4e-6 rad at position 23 and frequency 1; its float32 inv_freq adds about as much), and
# anyrope forms them exactly: cos and sin differ by ~1e-6. Through these 2-layer random models
# (initializer_range 0.1, attention scores of order 1) that becomes, measured over every family
# here, at most 9.6e-7 of the logits' scale in the forward (median 4e-7) and 1.1e-6 in the 16
# decoding steps (positions up to 23). The bound leaves 10x room; a 1% frequency error moves the
# same outputs by 1.3e-4 or more (a wrong pairing, width or position by O(1e-2..1)), and the
# smallest greedy top-2 margin of the stock runs is 2.3e-4.
LOGITS_RTOL = 1e-5

NEW_TOKENS = 16


def main_output(out: Any) -> torch.Tensor:
    """The logits, or the last hidden state of a model without a head."""
    logits = getattr(out, "logits", None)
    return logits if logits is not None else out.last_hidden_state


def relative(stock: torch.Tensor, other: torch.Tensor) -> float:
    """The largest difference, relative to the stock values' scale (floored at 1)."""
    return float((stock - other).abs().max()) / max(float(stock.abs().max()), 1.0)


def margin(scores: torch.Tensor) -> float:
    """The smallest lead of a greedy pick over the runner-up; a fully masked (forced) step has none."""
    top = scores.float().topk(2, dim=-1).values
    lead = (top[..., 0] - top[..., 1]).nan_to_num(nan=float("inf"))
    return float(torch.where(torch.isfinite(top[..., 0]), lead, float("inf")).min())


def assert_same_greedy(
    name: str,
    stock_scores: torch.Tensor,
    stock_tokens: torch.Tensor,
    patched_scores: torch.Tensor,
    patched_tokens: torch.Tensor,
) -> None:
    """The same greedy picks and tokens, where no stock pick is a tie within the tolerance."""
    lead = margin(stock_scores)
    scale = max(float(stock_scores[torch.isfinite(stock_scores)].abs().max()), 1.0)
    assert lead > LOGITS_RTOL * scale, (
        f"{name}: a greedy step's top-2 margin ({lead:.2e}) is within the logits tolerance, so "
        "a differing token would be a tie: choose another seed (OVERRIDES '_seed')"
    )
    # The picks from the scores too: Higgs generates audio codebooks, with scores per codebook.
    assert torch.equal(stock_scores.argmax(-1), patched_scores.argmax(-1)), (
        f"{name}: greedy picks differ (smallest top-2 margin of the stock run {lead:.2e})"
    )
    assert torch.equal(stock_tokens, patched_tokens), (
        f"{name}: greedy tokens differ (smallest top-2 margin of the stock run {lead:.2e})\n"
        f"stock   {stock_tokens.tolist()}\npatched {patched_tokens.tolist()}"
    )


@pytest.fixture(autouse=True)
def quiet_and_fast() -> Iterator[None]:
    # One intra-op thread: the matrices are tiny, and a second thread that spins waiting for work
    # makes each op ~10x slower on a busy 2-core machine.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' notes on tiny random configs
        yield
    torch.set_num_threads(threads)


class InModel:
    """A family's tiny model and how it takes tokens; subclasses form the inputs."""

    embeddings: torch.Tensor  # for models that take embeddings, not token ids

    def __init__(self, family: Family) -> None:
        self.name = family.model_type
        self.overrides = OVERRIDES.get(family.model_type, {})
        self.model = tiny_model(family.model_type)

    def accepts(self, name: str) -> bool:
        return name in inspect.signature(self.model.forward).parameters

    def tokens(self, ids: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.overrides.get("_inputs_embeds"):
            return {"inputs_embeds": self.embeddings[ids]}
        return {"input_ids": ids}

    def greedy(
        self,
        out: Any,
        mask: torch.Tensor,
        pick: Callable[[Any, int], torch.Tensor],
        step_inputs: Callable[[torch.Tensor, int], dict[str, Any]],
    ) -> tuple[list[torch.Tensor], list[Any]]:
        """generate's loop after the prompt's output ``out``: each step picks a token, extends the
        mask and runs it on the KV cache. The tokens and each step's output."""
        tokens, outs = [], []
        for step in range(NEW_TOKENS):
            token = pick(out, step)
            tokens.append(token)
            mask = torch.cat((mask, torch.ones_like(token)), dim=-1)
            out = self.model(
                **step_inputs(token, step),
                attention_mask=mask,
                past_key_values=out.past_key_values,
                use_cache=True,
            )
            outs.append(out)
        return tokens, outs
