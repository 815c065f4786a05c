"""M-RoPE families in their own transformers models, at image-like positions, rotating with anyrope.

test_families.py runs every supported family, M-RoPE ones included, at text positions, where all
of an M-RoPE model's position streams are equal and it rotates as plain RoPE; this file runs the
M-RoPE families (``multi_axis`` set, no ``unsupported`` reason) where the streams differ. Each
family's tiny random-weight model (``tiny_models.tiny_model``) gets a batch of two rows with
position ids of shape (3, batch, seq), time / height / width, as Qwen2-VL's ``get_rope_index``
forms them: text tokens count up on all three streams; an image's tokens (a grid after the
spatial merge) all take the time position where the image starts, and height and width that
position plus the token's row and column; the text after it continues at the largest position so
far plus one. Row 0 is 2 text tokens, a 2x8 image, 2 text tokens; row 1 a 4x4 image, then 4 text
tokens, so the rows' last positions differ (11 and 7). It checks:

* the forward output (logits, or the last hidden state for models without a head), stock and
  after ``use_anyrope(model)``: equal within the relative tolerance of in_model.py
  (``LOGITS_RTOL``, justified there); and that the image positions matter, so that a pair on the
  wrong stream would show: the stock output at plain text positions, and with the height stream,
  or the width stream, replaced by the time stream, each differ from it by at least 10x that
  tolerance. (The width stream is the weakest: Qwen2-VL's contiguous sections give it the lowest
  frequencies, 1e6 ** (-5/8) and below, so it moves the output by only ~2.5e-4 of its scale
  with an image 8 tokens wide, 4e-5 with one 3 wide, as the real models' do at small positions.)
* 16 greedy steps on the KV cache after that prompt, by hand as ``generate`` would run them for
  these models: each step's position is the row's largest prompt position (over all streams)
  plus one plus the step, the same on all three streams, passed as (3, batch, 1); tokens by argmax
  of the logits (for models without a head, of a fixed random projection of the last hidden state
  to 128 "vocabulary" logits). Stock and patched: the same tokens and each step's outputs within
  the tolerance, with every stock greedy pick ahead of its runner-up by more than the tolerance
  (else a differing token would be a tie, not an error).

NeoMME (an encoder, two streams: row and column) runs the forward only, at positions as its
processor forms them for a document image: ``<doc> <img>`` at (0, 0) and (1, 1), then the patch
grid and its row markers at (2 + row, 2 + column); a 3x3 grid in row 0, a 2x5 grid in row 1.

That anyrope's tables equal each family's rotary module at positions whose streams differ (and
far from 0), q and k rotated by its own ``apply_rotary_pos_emb``, is test_family_layouts.py's; this
file checks the models around them: the position ids' shapes on the way in, partial rotation and
pairing through the attention code, the cache, and decoding at M-RoPE positions.
"""

from __future__ import annotations

from typing import Any

import pytest

from anyrope._families import FAMILIES, Family

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", minversion="5.0")

from peers.in_model import (  # noqa: F401 - quiet_and_fast: an autouse fixture, one thread, no grad
    LOGITS_RTOL,
    InModel,
    assert_same_greedy,
    main_output,
    quiet_and_fast,
    relative,
)
from peers.tiny_models import NOT_IN_MODEL

from anyrope.integrations.transformers import remove_anyrope, use_anyrope

MROPE = [f for f in FAMILIES if f.multi_axis is not None and f.unsupported is None]

VOCAB = 128
SENSITIVITY = 10  # each stream must move the stock output by this many tolerances

Segments = list[tuple[int, ...]]  # (n,): n text tokens; (h, w): an image grid of h rows, w columns
# Each row: 20 tokens.
QWEN_ROWS: list[Segments] = [[(2,), (2, 8), (2,)], [(4, 4), (4,)]]
NEOMME_GRIDS = [(3, 3), (2, 5)]  # (rows, columns): 2 + rows * (columns + 1) = 14 tokens each


def _qwen_positions(segments: Segments) -> torch.Tensor:
    """(3, seq) time / height / width positions, as Qwen2-VL's get_rope_index forms them."""
    streams: list[list[int]] = [[], [], []]
    start = 0
    for segment in segments:
        if len(segment) == 1:
            for stream in streams:
                stream.extend(range(start, start + segment[0]))
            start += segment[0]
        else:
            height, width = segment
            for row in range(height):
                for column in range(width):
                    streams[0].append(start)
                    streams[1].append(start + row)
                    streams[2].append(start + column)
            start += max(height, width)  # the largest position so far, plus one
    return torch.tensor(streams)


def _neomme_positions(rows: int, columns: int) -> torch.Tensor:
    """(2, seq) row / column positions, as NeoMME's processor forms them for a document image."""
    grid = [(2 + r, 2 + c) for r in range(rows) for c in range(columns + 1)]  # + a row marker
    return torch.tensor([(0, 0), (1, 1), *grid]).T


class Run(InModel):
    """One family's tiny model at image-like positions: its forward and its greedy decoding."""

    def __init__(self, family: Family) -> None:
        super().__init__(family)
        self.neomme = family.multi_axis == "alternating"
        if self.neomme:
            self.positions = torch.stack([_neomme_positions(*grid) for grid in NEOMME_GRIDS], dim=1)
        else:
            self.positions = torch.stack([_qwen_positions(row) for row in QWEN_ROWS], dim=1)
        batch, length = self.positions.shape[1:]
        hidden = self.model.config.get_text_config(decoder=True).hidden_size
        generator = torch.Generator().manual_seed(self.overrides.get("_seed", 1))
        self.ids = torch.randint(3, VOCAB, (batch, length), generator=generator)
        self.embeddings = torch.randn(VOCAB, hidden, generator=generator)  # for embeddings-only models
        self.projection = torch.randn(VOCAB, hidden, generator=generator)  # "logits" of headless models

    def forward(self, positions: torch.Tensor | None = None) -> torch.Tensor:
        positions = self.positions if positions is None else positions
        mask = torch.ones_like(self.ids)
        return main_output(self.model(**self.tokens(self.ids), attention_mask=mask, position_ids=positions))

    def _logits(self, out: Any) -> torch.Tensor:
        logits = getattr(out, "logits", None)
        return logits[:, -1] if logits is not None else out.last_hidden_state[:, -1] @ self.projection.T

    def decode(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """16 greedy tokens on the KV cache after the prompt: (tokens, each step's logits or
        projected logits, each step's main output)."""
        mask = torch.ones_like(self.ids)
        out = self.model(
            **self.tokens(self.ids), attention_mask=mask, position_ids=self.positions, use_cache=True
        )
        # The next text token's position: the row's largest so far, plus one, on every stream.
        following = self.positions.amax(dim=(0, 2)) + 1

        def step_inputs(token: torch.Tensor, step: int) -> dict[str, Any]:
            position = (following + step)[None, :, None].expand(self.positions.shape[0], -1, 1)
            return {**self.tokens(token), "position_ids": position}

        tokens, outs = self.greedy(
            out, mask, lambda out, step: self._logits(out).argmax(-1, keepdim=True), step_inputs
        )
        logits = torch.stack([self._logits(o) for o in outs], dim=1)
        return torch.cat(tokens, dim=-1), logits, torch.stack([main_output(o)[:, -1] for o in outs], dim=1)


@pytest.mark.parametrize("family", MROPE, ids=[f.model_type for f in MROPE])
def test_mrope_in_model(family: Family) -> None:
    if family.model_type in NOT_IN_MODEL:
        pytest.skip(NOT_IN_MODEL[family.model_type])
    name = family.model_type
    run = Run(family)
    stock = run.forward()

    # The image positions matter: plain text positions, or one stream's positions replaced by the
    # first's, move the stock output far beyond the tolerance.
    streams, batch, length = run.positions.shape
    changed = {"text positions": torch.arange(length).expand(streams, batch, length)}
    for stream in range(1, streams):
        positions = run.positions.clone()
        positions[stream] = positions[0]
        changed[f"stream {stream} replaced by stream 0"] = positions
    for what, positions in changed.items():
        moved = relative(stock, run.forward(positions))
        assert moved > SENSITIVITY * LOGITS_RTOL, (
            f"{name}: {what} move the stock output by only {moved:.2e} of its scale: the test "
            "could not tell a wrong stream from a right one"
        )
    decoding = not run.neomme
    if decoding:
        stock_tokens, stock_logits, stock_steps = run.decode()

    use_anyrope(run.model)
    patched = run.forward()
    if decoding:
        patched_tokens, patched_logits, patched_steps = run.decode()
    remove_anyrope(run.model)
    assert torch.equal(run.forward(), stock), f"{name}: remove_anyrope did not restore the stock outputs"

    rel = relative(stock, patched)
    assert rel <= LOGITS_RTOL, f"{name}: outputs differ by {rel:.2e} of their scale, over {LOGITS_RTOL:.0e}"
    if not decoding:
        return
    assert_same_greedy(name, stock_logits, stock_tokens, patched_logits, patched_tokens)
    rel = relative(stock_steps, patched_steps)
    assert rel <= LOGITS_RTOL, f"{name}: decoding steps differ by {rel:.2e} of their scale"
    rel = relative(stock_logits, patched_logits)
    assert rel <= LOGITS_RTOL, f"{name}: decoding logits differ by {rel:.2e} of their scale"
