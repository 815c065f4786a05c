"""A call's plan is kept per signature (anyrope._plan): a kept plan never serves a call it does not fit.

Each field of a call's signature is changed alone after a first call made a plan; the call then
gets a plan of its own, whose result is a fresh RoPE's bit for bit, or the very error a first
call gets. Values (offsets, positions) never make a plan: they are checked on every call.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import anyrope
from anyrope._rope import rotary_of

from harness import Backend

RNG = np.random.default_rng(11)
Q, K = RNG.standard_normal((2, 4, 6, 16)), RNG.standard_normal((2, 2, 6, 16))


def _plans(rope: anyrope.RoPE) -> int:
    return len(rotary_of(rope).plans)


def _fresh(call: Callable[[anyrope.RoPE], Any]) -> Any:
    """``call`` on a RoPE that has made no plan: what any call must give."""
    return call(anyrope.RoPE(16, rotary_dim=12))


def _error(call: Callable[[anyrope.RoPE], Any]) -> tuple[type[BaseException], str]:
    with pytest.raises(Exception) as raised:
        call(anyrope.RoPE(16, rotary_dim=12))
    return raised.type, str(raised.value)


def _same(backend: Backend, got: Any, want: Any) -> None:
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,),
                    strict=True):  # fmt: skip
        np.testing.assert_array_equal(backend.to_numpy(g), backend.to_numpy(w))


@pytest.mark.backends("numpy", "torch", "mlx")
def test_each_signature_field_changed_alone_gets_its_own_plan(backend: Backend) -> None:
    """The first call makes a plan and later calls with other values reuse it; each field
    changed alone makes a plan of its own, whose result is a fresh RoPE's, or raises a first
    call's error (seq_axis -2.0, inverse=1, positions beside an offset)."""
    if backend.device_kind != "cpu" and backend.name != "mlx":
        pytest.skip("a CPU signature is changed here; other devices: test_a_device_change_gets_its_own_plan")
    rope = anyrope.RoPE(16, rotary_dim=12)
    q, k = backend.asarray(Q, "float32"), backend.asarray(K, "float32")

    def base(r: anyrope.RoPE) -> Any:
        return r(q, k, offset=5)

    _same(backend, base(rope), _fresh(base))
    assert _plans(rope) == 1
    for offset in (0, 7, -3, 2**40):  # values: the same plan, checked per call
        _same(backend, rope(q, k, offset=offset), _fresh(lambda r, o=offset: r(q, k, offset=o)))
    assert _plans(rope) == 1
    changed: dict[str, Callable[[anyrope.RoPE], Any]] = {
        "dtype": lambda r: r(q, backend.asarray(K, "float16"), offset=5),
        "shape": lambda r: r(q, k[:1], offset=5),
        "k left out": lambda r: r(q, offset=5),
        "seq_axis": lambda r: r(q, k, offset=5, seq_axis=-3),
        "inverse": lambda r: r(q, k, offset=5, inverse=True),
        "offsets as an array": lambda r: r(q, k, offset=backend.asarray(np.array([3, 9]))),
        "offsets of another dtype": lambda r: r(
            q, k, offset=backend.asarray(np.array([3, 9], dtype=np.int32))
        ),
        "positions": lambda r: r(q, k, positions=backend.asarray(np.arange(6) * 7)),
        "positions per row": lambda r: r(q, k, positions=backend.asarray(np.arange(12).reshape(2, 6))),
    }
    if "inplace" not in backend.deviations:
        changed["inplace"] = lambda r: r(
            backend.asarray(Q, "float32"), backend.asarray(K, "float32"), offset=5, inplace=True
        )
    for plans, (name, call) in enumerate(changed.items(), start=2):
        _same(backend, call(rope), _fresh(call))
        assert _plans(rope) == plans, name
    with anyrope.use_fast_paths(False):  # the kernel switch
        _same(backend, base(rope), _fresh(base))
    assert _plans(rope) == len(changed) + 2
    errors: dict[str, Callable[[anyrope.RoPE], Any]] = {
        "seq_axis -2.0": lambda r: r(q, k, offset=5, seq_axis=-2.0),
        "inverse=1": lambda r: r(q, k, offset=5, inverse=1),
        "positions and an offset": lambda r: r(q, k, positions=backend.asarray(np.arange(6)), offset=5),
        "offset past the integers": lambda r: r(q, k, offset=2**63 - 3),
        "an offset of each row too many": lambda r: r(q, k, offset=backend.asarray(np.array([1, 2, 3]))),
        "a float offset": lambda r: r(q, k, offset=5.0),
        "k not an array": lambda r: r(q, K.tolist(), offset=5),
    }
    if backend.name != "mlx":  # whose offsets are never read on the host
        errors["a row offset past them"] = lambda r: r(q, k, offset=backend.asarray(np.array([0, 2**63 - 3])))
    for name, call in errors.items():
        kind, message = _error(call)
        # after the calls above, and again once it failed: the first call's error every time
        for _ in range(2):
            with pytest.raises(kind, match=re.escape(message)):
                call(rope)
        del name


@pytest.mark.backends("numpy", "torch")
def test_a_stride_change_gets_its_own_plan(backend: Backend) -> None:
    """The same shape through a transposed view: the strides are the signature's."""
    rope = anyrope.RoPE(16, rotary_dim=12)
    xp = backend.xp
    dense = backend.asarray(Q, "float32")
    strided = xp.permute_dims(
        backend.asarray(np.ascontiguousarray(Q.transpose(0, 2, 1, 3)), "float32"), (0, 2, 1, 3)
    )
    calls = [lambda r, x=x: r(x, offset=5) for x in (dense, strided)]
    for call in calls:
        _same(backend, call(rope), _fresh(call))
    assert _plans(rope) == 2
    if "inplace" not in backend.deviations:  # in place into strided memory, then dense again
        for x in (strided, dense):
            want = _fresh(lambda r, x=x: r(backend.asarray(backend.to_numpy(x), "float32"), offset=5))
            assert rope(x, offset=5, inplace=True) is x
            _same(backend, x, want)


@pytest.mark.backends("torch")
def test_grad_mode_and_device_changes_get_their_own_plan(backend: Backend) -> None:
    """A tensor that requires grad, the same under no_grad, and on the meta device (no values:
    a traced plan, never kept) each get their own plan; gradients flow where they should."""
    import torch

    rope = anyrope.RoPE(16, rotary_dim=12)
    q = torch.tensor(Q, dtype=torch.float32)
    rope(q, offset=5)
    leaf = q.clone().requires_grad_(True)
    out = rope(leaf, offset=5)
    out.sum().backward()
    assert leaf.grad is not None
    _same(backend, out.detach(), _fresh(lambda r: r(q, offset=5)))
    assert _plans(rope) == 2
    with torch.no_grad():
        plain = rope(leaf, offset=5)
    assert not plain.requires_grad
    assert _plans(rope) == 3
    meta = rope(torch.empty(2, 4, 6, 16, device="meta"), offset=5)
    assert meta.device.type == "meta"
    assert _plans(rope) == 3  # a meta call is traced: its plan is used once


@pytest.mark.backends("numpy", "torch")
def test_apply_into_out_and_back(backend: Backend) -> None:
    """apply(x, cos, sin) then into ``out=``: each call is planned anew (apply keeps no plan)."""
    if "inplace" in backend.deviations:
        pytest.skip(backend.deviations["inplace"]["reason"])
    rope = anyrope.RoPE(16, rotary_dim=12)
    x = backend.asarray(Q, "float32")
    cos, sin = rope.cos_sin(backend.asarray(np.arange(6)), like=x)
    new = anyrope.apply(x, cos, sin)
    out = backend.asarray(np.zeros(Q.shape), "float32")
    assert anyrope.apply(x, cos, sin, out=out) is out
    _same(backend, out, new)
    _same(backend, anyrope.apply(x, cos, sin), new)


@pytest.mark.backends("numpy")
def test_a_plan_is_not_pickled_and_a_copy_starts_without(backend: Backend) -> None:
    import copy
    import pickle

    rope = anyrope.RoPE(16)
    rope(backend.asarray(Q, "float32"))
    assert _plans(rope) == 1
    for again in (pickle.loads(pickle.dumps(rope)), copy.deepcopy(rope)):
        assert _plans(again) == 0
        _same(backend, again(backend.asarray(Q, "float32")), rope(backend.asarray(Q, "float32")))


@pytest.mark.backends("torch")
def test_layers_sharing_a_positions_tensor_form_its_angles_once(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Layers (each its own RoPE of one configuration) given one positions tensor form its
    tables once, until the tensor is written in place (its version changes) or another tensor
    comes; inference tensors, which count no versions, form them every time. Results are a
    fresh RoPE's bit for bit throughout."""
    import torch

    from anyrope import _tables

    formed: list[int] = []
    tables = _tables.PositionTables._tables

    def spy(self: Any, seq: int, dtype: Any) -> Any:
        formed.append(seq)
        return tables(self, seq, dtype)

    monkeypatch.setattr(_tables.PositionTables, "_tables", spy)
    layers = [anyrope.RoPE(16, rotary_dim=12) for _ in range(4)]
    q, k = torch.tensor(Q, dtype=torch.float32), torch.tensor(K, dtype=torch.float32)
    positions = torch.tensor([[3, 4, 5, 6, 7, 8], [40, 41, 42, 43, 44, 45]])

    def forward() -> list[Any]:
        return [layer(q, k, positions=positions) for layer in layers]

    def check(formed_now: int) -> None:
        """A forward pass, then its results against a fresh RoPE's (which forms tables itself)."""
        got = forward()
        assert len(formed) == formed_now
        want = _fresh(lambda r: r(q, k, positions=positions.clone()))
        for layer in got:
            _same(backend, layer, want)
        del formed[formed_now:]

    with anyrope.use_fast_paths(False):  # the generic kernel reads tables (numba reads cached rows)
        check(1)
        positions += 1  # in place: a new version
        check(2)
        positions = positions.clone()  # another tensor
        check(3)
        with torch.inference_mode():
            positions = torch.tensor([[0, 1, 2, 3, 4, 5], [9, 9, 9, 9, 9, 9]])
            check(3 + len(layers))
