"""Gradients flow through RoPE, and equal the inverse rotation of the upstream gradient."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import anyrope

from harness import Backend, assert_close


@pytest.fixture
def grad_backend(backend: Backend) -> Backend:
    if not backend.autograd:
        pytest.skip(f"{backend.name} has no automatic differentiation")
    return backend


def _compiled_vjp(backend: Backend, mode: str, fn: Any, x: Any, upstream: Any) -> Any:
    """The gradient, taken inside the compiled function (jax.jit of jax.vjp, mx.compile of mx.vjp,
    torch.compile of a forward and backward)."""
    if backend.name == "torch":
        compiled = backend.compile(fn, mode)
        return backend.vjp(compiled, x, upstream)
    return backend.compile(lambda t, u: backend.vjp(fn, t, u), mode)(x, upstream)


@pytest.mark.dtypes("float32", "float64")
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("where", ["offset", "positions", "rows"])
def test_gradient_is_inverse_rotation(
    grad_backend: Backend, mode: str, dtype: str, layout: str, where: str
) -> None:
    backend = grad_backend
    rope = anyrope.RoPE(12, layout=layout, rotary_dim=8)
    rng = np.random.default_rng(0)
    kwargs: dict[str, object] = {
        "offset": {"offset": 3},
        "positions": {"positions": [4, 0, 7, 7, 2]},
        "rows": {"offset": [0, 9]},
    }[where]
    x = backend.asarray(rng.standard_normal((2, 3, 5, 12)), dtype)
    upstream = backend.asarray(rng.standard_normal((2, 3, 5, 12)), dtype)
    grad = _compiled_vjp(backend, mode, lambda t: rope(t, **kwargs), x, upstream)
    if where == "positions":
        positions = backend.asarray(np.array([4, 0, 7, 7, 2]))
    elif where == "rows":
        positions = backend.asarray(np.array([[0], [9]]) + np.arange(5))
    else:
        positions = backend.asarray(np.arange(3, 8))
    cos, sin = rope.cos_sin(positions, like=upstream)
    expected = anyrope.apply(upstream, cos, sin, layout=layout, inverse=True)
    assert_close(backend, grad, backend.to_numpy(expected), dtype)


@pytest.mark.dtypes("float16", "bfloat16")
def test_gradient_through_q_and_k_in_half_precision(grad_backend: Backend, dtype: str) -> None:
    backend = grad_backend
    rope = anyrope.RoPE(8)
    x = backend.asarray(np.random.default_rng(1).standard_normal((1, 2, 4, 8)), dtype)
    upstream = backend.asarray(np.ones((1, 2, 4, 8)), dtype)
    grad = backend.vjp(lambda t: rope(t, t)[1], x, upstream)
    assert grad.dtype == x.dtype
    cos, sin = rope.cos_sin(backend.asarray(np.arange(4)), like=backend.asarray(np.zeros(1), "float32"))
    expected = anyrope.apply(backend.xp.astype(upstream, backend.xp.float32), cos, sin, inverse=True)
    assert_close(backend, grad, backend.to_numpy(expected), dtype)


@pytest.mark.backends("torch")
def test_torch_tables_built_in_inference_mode_serve_autograd(backend: Backend) -> None:
    import torch

    anyrope.table_cache.clear()
    rope = anyrope.RoPE(8, base=1234.0)
    x = backend.asarray(np.ones((1, 3, 8)), "float32")
    with torch.inference_mode():
        rope(x)  # fills the cache inside inference mode
    leaf = x.detach().clone().requires_grad_(True)
    rope(leaf).sum().backward()
    assert leaf.grad is not None
    assert leaf.grad.shape == leaf.shape
