"""The :class:`RoPE` object: a configuration plus cached tables, callable on q and k."""

from __future__ import annotations

import math
from typing import Any

from ._compat import array_namespace, compute_dtype, device_of, isdtype, materialize, take_rows
from ._fast import fast_paths_enabled
from ._fast.cpu_positions import rotate_at
from ._layout import Layout, check_rotary_dim, normalize_layout
from ._positions import as_index_array, is_array, plain_offset
from ._rotate import check_input, check_out, normalize_seq_axis, rotate
from ._tables import cache_key, cos_sin, table_cache
from .scaling import Scaling

__all__ = ["RoPE"]


class _Frequencies:
    """Hashable frequencies and table scale; the hash is computed once, as keys are built per call."""

    __slots__ = ("_hash", "inv_freq", "scale")

    def __init__(self, inv_freq: tuple[float, ...], scale: float) -> None:
        self.inv_freq, self.scale = inv_freq, scale
        self._hash = hash((inv_freq, scale))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, _Frequencies) and self.inv_freq == other.inv_freq and self.scale == other.scale
        )


class RoPE:
    """Rotary position embedding for q and k arrays of any supported library.

    Parameters
    ----------
    head_dim : int
        Features per attention head (the last axis of q and k); positive and even.
    base : float
        The frequency base: pair i turns by ``base ** (-2i / rotary_dim)`` radians per position.
    rotary_dim : int, optional
        Rotate only the first ``rotary_dim`` features of each head (partial rotary, as in GPT-NeoX
        and Phi); the rest pass through bit-identical. Even, at most ``head_dim``; defaults to it.
    layout : str
        "half" (pairs i, i + r/2: GPT-NeoX, Hugging Face) or "interleaved" (pairs 2i, 2i + 1:
        RoFormer, GPT-J, Meta), or the aliases "neox", "hf", "gptj", "meta".
    scaling : anyrope.scaling.Scaling, optional
        Long-context scaling (``Linear``, ``NTKAware``, ``DynamicNTK``, ``YaRN``, ``Llama3``,
        ``LongRoPE``, ``Proportional``, ``MaxLengthAware``); None is plain RoPE.
    max_position : int, optional
        The longest context the model supports (``max_position_embeddings``): tables for it are
        built on first use, and scaling methods that derive defaults from it read it.

    Examples
    --------
    >>> import numpy as np
    >>> import anyrope
    >>> rope = anyrope.RoPE(8)
    >>> q = np.ones((1, 2, 3, 8), dtype=np.float32)   # (batch, heads, seq, head_dim)
    >>> q_rot, k_rot = rope(q, q)
    >>> q_rot.shape, q_rot.dtype
    ((1, 2, 3, 8), dtype('float32'))
    >>> bool(np.all(rope(q, offset=2)[..., 0, :] == q_rot[..., 2, :]))
    True
    """

    __slots__ = (
        "_base",
        "_by_length",
        "_freqs",
        "_head_dim",
        "_layout",
        "_max_position",
        "_rotary_dim",
        "_scaling",
    )

    def __init__(
        self,
        head_dim: int,
        *,
        base: float = 10000.0,
        rotary_dim: int | None = None,
        layout: str = "half",
        scaling: Any = None,
        max_position: int | None = None,
    ) -> None:
        if isinstance(head_dim, bool) or not isinstance(head_dim, int):
            raise TypeError(f"head_dim must be an int, not {type(head_dim).__name__}")
        if head_dim <= 0 or head_dim % 2:
            raise ValueError(f"head_dim={head_dim} must be a positive even number (features rotate in pairs)")
        rotary_dim = head_dim if rotary_dim is None else rotary_dim
        check_rotary_dim(rotary_dim, head_dim)
        if (
            isinstance(base, bool)
            or not isinstance(base, (int, float))
            or not math.isfinite(base)
            or base <= 0
        ):
            raise ValueError(f"base={base!r} must be a positive finite number (10000.0 in most models)")
        if max_position is not None and (
            isinstance(max_position, bool) or not isinstance(max_position, int) or max_position <= 0
        ):
            raise ValueError(f"max_position={max_position!r} must be a positive int or None")
        if scaling is not None and not isinstance(scaling, Scaling):
            raise TypeError(
                f"scaling must be None or a method from anyrope.scaling (Linear, NTKAware, DynamicNTK, "
                f"YaRN, Llama3, LongRoPE, Proportional, MaxLengthAware), not {scaling!r}; for a model's "
                "config use RoPE.from_hf_config"
            )
        self._head_dim = head_dim
        self._rotary_dim = rotary_dim
        self._base = float(base)
        self._layout: Layout = normalize_layout(layout)
        self._max_position = max_position
        self._scaling: Scaling = scaling if scaling is not None else Scaling()
        self._by_length: dict[int, _Frequencies] = {}
        self._freqs = self._compute(None)

    @classmethod
    def from_hf_config(cls, config: Any, *, layout: str | None = None, layer_type: str | None = None) -> RoPE:
        """The RoPE a Hugging Face model was trained with, from its config.

        Parameters
        ----------
        config : dict or transformers config
            A ``config.json`` as a dict, or a ``transformers.PretrainedConfig``. Read:
            ``qk_rope_head_dim`` (DeepSeek) or ``head_dim`` (or ``hidden_size / num_attention_heads``),
            ``partial_rotary_factor``, ``rope_theta``,
            ``rope_scaling`` (old, with ``type`` or ``rope_type``) or ``rope_parameters`` (v5),
            ``max_position_embeddings`` and a top-level ``original_max_position_embeddings``.
        layout : str, optional
            transformers' models rotate in the "half" layout, which is the default unless the
            config sets ``rope_interleave`` (DeepSeek); say "interleaved" for a checkpoint kept
            in Meta's layout.
        layer_type : str, optional
            For configs with RoPE parameters per layer type (e.g. "full_attention").

        Raises
        ------
        ValueError
            For a ``rope_type`` anyrope does not implement, naming it.

        Examples
        --------
        >>> import anyrope
        >>> rope = anyrope.RoPE.from_hf_config({
        ...     "hidden_size": 4096, "num_attention_heads": 32, "rope_theta": 500000.0,
        ...     "max_position_embeddings": 131072,
        ...     "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
        ...                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}})
        >>> rope.head_dim, rope.base, type(rope.scaling).__name__
        (128, 500000.0, 'Llama3')
        """
        from ._hf import parse_hf_config

        kwargs = parse_hf_config(config, layer_type=layer_type)
        if layout is not None:
            kwargs["layout"] = layout
        return cls(**kwargs)

    head_dim = property(lambda self: self._head_dim, doc="Features per head.")
    rotary_dim = property(lambda self: self._rotary_dim, doc="Rotated features per head.")
    base = property(lambda self: self._base, doc="The frequency base.")
    layout = property(lambda self: self._layout, doc='The canonical layout, "half" or "interleaved".')

    @property
    def scaling(self) -> Scaling | None:
        """The long-context scaling, or None for plain RoPE."""
        return None if type(self._scaling) is Scaling else self._scaling

    max_position = property(lambda self: self._max_position, doc="The expected longest context, or None.")

    @property
    def inv_freq(self) -> tuple[float, ...]:
        """Radians per position of each pair, as float64 Python floats (``rotary_dim // 2`` of them).

        For methods that change with the sequence (``DynamicNTK``, ``LongRoPE``) these are the
        frequencies within the original context; see :meth:`inv_freq_at`.
        """
        return self._freqs.inv_freq

    def inv_freq_at(self, seq_len: int) -> tuple[float, ...]:
        """The frequencies used for a sequence of ``seq_len`` positions (``max(positions) + 1``)."""
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 0:
            raise ValueError(f"seq_len={seq_len!r} must be a non-negative int")
        return self._at(seq_len).inv_freq

    @property
    def attention_scaling(self) -> float:
        """The factor the tables, and so the rotated q and k, carry (logits scale by its square).

        1.0 for plain RoPE; YaRN's and LongRoPE's attention factors otherwise, as in transformers.
        """
        return self._freqs.scale

    def _compute(self, seq_len: int | None) -> _Frequencies:
        inv_freq, scale = self._scaling.frequencies(
            self._rotary_dim, self._base, seq_len=seq_len, max_position=self._max_position
        )
        return _Frequencies(tuple(float(f) for f in inv_freq), float(scale))

    def _at(self, seq_len: int | None) -> _Frequencies:
        """Frequencies for a sequence length; the same object for every length that shares them."""
        if seq_len is None or not self._scaling.length_dependent:
            return self._freqs
        found = self._by_length.get(seq_len)
        if found is None:
            found = self._compute(seq_len)
            if found == self._freqs:
                found = self._freqs
            if len(self._by_length) >= 256:  # decoding under DynamicNTK meets every length once
                self._by_length.clear()
            self._by_length[seq_len] = found
        return found

    def _length(self, xp: Any, where: tuple[str, Any], seqs: list[int]) -> int | None:
        """``max(positions) + 1`` where the frequencies depend on it (a device sync for arrays)."""
        if not self._scaling.length_dependent:
            return None
        kind, value = where
        if kind == "offset":
            return int(value) + max(seqs)
        if math.prod(value.shape) == 0:
            return None
        top = int(xp.max(value))
        return top + (max(seqs) if kind == "rows" else 1)

    def __repr__(self) -> str:
        parts = [f"{self._head_dim}", f"base={self._base!r}"]
        if self._rotary_dim != self._head_dim:
            parts.append(f"rotary_dim={self._rotary_dim}")
        parts.append(f"layout={self._layout!r}")
        if self.scaling is not None:
            parts.append(f"scaling={self.scaling!r}")
        if self._max_position is not None:
            parts.append(f"max_position={self._max_position}")
        return f"RoPE({', '.join(parts)})"

    def cos_sin(self, positions: Any, *, like: Any) -> tuple[Any, Any]:
        """Compact tables for ``positions``: shape ``positions.shape + (rotary_dim // 2,)``.

        They come in ``like``'s library, device and dtype, ready for :func:`anyrope.apply`.
        Angles are formed in float64 and only the final values are cast.
        """
        xp = array_namespace(like=like, positions=positions if is_array(positions) else None)
        if not isdtype(xp, like.dtype, "real floating"):
            raise TypeError(f"like must be a real floating-point array, got dtype {like.dtype}")
        device = device_of(xp, like)
        positions = as_index_array(xp, positions, device=device, arg="positions", ndims=None)
        freqs = self._at(self._length(xp, ("positions", positions), [1]))
        return _tables(xp, positions, freqs, like.dtype, device)

    def _prefix(
        self, xp: Any, freqs: _Frequencies, length: int, dtype: Any, device: Any
    ) -> tuple[Any, Any] | None:
        """Cached tables for positions 0 .. length - 1 or more, or None where none are kept."""
        if freqs is not self._freqs and self._scaling.continuous:
            return None  # DynamicNTK past the original length: new frequencies at every length

        def build(n: int) -> tuple[Any, Any]:
            cos, sin = _tables(xp, xp.arange(n, dtype=xp.int64, device=device), freqs, dtype, device)
            materialize(xp, cos, sin)  # the cache shares them across threads
            return cos, sin

        row_bytes = self._rotary_dim * _itemsize(xp, dtype)
        key = cache_key(xp, device, dtype, freqs)
        hint = self._max_position or 0
        return table_cache.prefix(key, length, build, row_bytes=row_bytes, hint=hint)

    def _range_tables(
        self, xp: Any, freqs: _Frequencies, start: int, length: int, dtype: Any, device: Any
    ) -> tuple[Any, Any]:
        """Rows start .. start + length - 1, sliced from the cached prefix table where it fits."""
        cached = self._prefix(xp, freqs, start + length, dtype, device)
        if cached is None:
            rows = xp.arange(start, start + length, dtype=xp.int64, device=device)
            return _tables(xp, rows, freqs, dtype, device)
        cos, sin = cached
        return cos[start : start + length, ...], sin[start : start + length, ...]

    def _gathered_tables(
        self, xp: Any, positions: Any, freqs: _Frequencies, dtype: Any, device: Any
    ) -> tuple[Any, Any]:
        """Tables for arbitrary positions: rows gathered from the cached prefix where it fits.

        The cached rows are the ones a direct computation gives, so both routes agree exactly.
        """
        count = math.prod(positions.shape)
        cached = self._prefix(xp, freqs, int(xp.max(positions)) + 1, dtype, device) if count else None
        if cached is None:
            return _tables(xp, positions, freqs, dtype, device)
        flat = xp.reshape(positions, (count,))
        shape = (*positions.shape, self._rotary_dim // 2)
        cos, sin = (xp.reshape(take_rows(xp, table, flat), shape) for table in cached)
        return cos, sin

    def __call__(
        self,
        q: Any,
        k: Any = None,
        *,
        positions: Any = None,
        offset: Any = 0,
        seq_axis: int = -2,
        inplace: bool = False,
    ) -> Any:
        """Rotate ``q`` (and ``k``) by their positions.

        Parameters
        ----------
        q, k : array
            ``(..., seq, head_dim)`` with ``seq_axis=-2``, or ``(batch, seq, heads, head_dim)`` with
            ``seq_axis=-3``. k may have another head count (grouped-query attention).
        positions : array or sequence of int, optional
            Integer positions, shape ``(seq,)`` or ``(batch, seq)`` (aligned with the first axis).
        offset : int or sequence of int
            Positions ``offset, offset + 1, ...``: the number of tokens already in the KV cache,
            or one such count per batch row. Ignored when ``positions`` is given.
        seq_axis : int
            The sequence axis of q and k.
        inplace : bool
            Overwrite q and k with the result (NumPy, PyTorch and CuPy arrays, not ones that
            require grad): no new memory, and no page faults for it.

        Returns
        -------
        array or (array, array)
            The rotated q, or (q, k), in the inputs' library, device and dtype.
        """
        named = {"q": q, "k": k}
        if is_array(positions):
            named["positions"] = positions
        if is_array(offset):
            named["offset"] = offset
        xp = array_namespace(**named)
        check_input(xp, q, arg="q", head_dim=self._head_dim)
        if k is not None:
            check_input(xp, k, arg="k", head_dim=self._head_dim)
        device = device_of(xp, q)
        where: tuple[str, Any]
        if positions is not None:
            if not (type(offset) is int and offset == 0):
                raise ValueError(
                    "pass positions or offset, not both (positions already say where each token is)"
                )
            where = ("positions", as_index_array(xp, positions, device=device, arg="positions", ndims=(1, 2)))
        else:
            start = plain_offset(offset)
            if start is None:
                where = ("rows", as_index_array(xp, offset, device=device, arg="offset", ndims=(1,)))
            else:
                where = ("offset", start)
        named_arrays = [("q", q)] if k is None else [("q", q), ("k", k)]
        if inplace:
            for arg, x in named_arrays:
                check_out(xp, x, x, arg=arg)
        axes = [normalize_seq_axis(seq_axis, x.ndim, arg=arg) for arg, x in named_arrays]
        seqs = [x.shape[axis] for (_, x), axis in zip(named_arrays, axes, strict=True)]
        freqs = self._at(self._length(xp, where, seqs))
        pairs = list(zip(named_arrays, axes, strict=True))
        for (arg, x), axis in pairs:
            _check_positions(x, arg, where, axis)
        if fast_paths_enabled() and (freqs is self._freqs or not self._scaling.continuous):
            dtype = compute_dtype(xp, q.dtype)
            fused = rotate_at(
                xp, [x for _, x in named_arrays], axes, where,
                lambda n: self._prefix(xp, freqs, n, dtype, device), layout=self._layout, inplace=inplace,
            )  # fmt: skip
            if fused is not None:
                return fused[0] if k is None else (fused[0], fused[1])
        tables: dict[tuple[int, str], tuple[Any, Any]] = {}  # q and k usually share them
        prepared = [self._prepare(xp, x, where, axis, device, freqs, tables) for (arg, x), axis in pairs]
        out = [
            rotate(
                xp, x, cos, sin, layout=self._layout, inverse=False, seq_axis=axis, out=x if inplace else None
            )
            for ((_, x), axis), (cos, sin) in zip(pairs, prepared, strict=True)
        ]
        return out[0] if k is None else (out[0], out[1])

    def _prepare(
        self,
        xp: Any,
        x: Any,
        where: tuple[str, Any],
        axis: int,
        device: Any,
        freqs: _Frequencies,
        tables: dict[tuple[int, str], tuple[Any, Any]],
    ) -> tuple[Any, Any]:
        """x's (cos, sin), shared through ``tables`` by arrays of one length and compute dtype."""
        seq = x.shape[axis]
        dtype = compute_dtype(xp, x.dtype)
        kind, value = where
        key = (seq, str(dtype))
        if key not in tables:
            if kind == "offset":
                tables[key] = self._range_tables(xp, freqs, value, seq, dtype, device)
            else:
                if kind == "rows":
                    value = value[:, None] + xp.arange(seq, dtype=value.dtype, device=device)
                tables[key] = self._gathered_tables(xp, value, freqs, dtype, device)
        return tables[key]


_itemsizes: dict[tuple[type, Any], int] = {}


def _itemsize(xp: Any, dtype: Any) -> int:
    key = (type(dtype), dtype)  # the type first: dtypes of two libraries are never compared
    size = _itemsizes.get(key)
    if size is None:
        size = _itemsizes[key] = xp.finfo(dtype).bits // 8
    return size


def _check_positions(x: Any, arg: str, where: tuple[str, Any], axis: int) -> None:
    """Per-row positions or offsets must match x's batch, and positions its sequence length."""
    kind, value = where
    if kind == "rows":
        _check_batch(x, arg, axis, value.shape[0], "offset")
    elif kind == "positions":
        seq = x.shape[axis]
        if value.shape[-1] != seq:
            raise ValueError(
                f"positions has {value.shape[-1]} entries per row but {arg} has {seq} "
                f"positions along its sequence axis ({axis})"
            )
        if value.ndim == 2:
            _check_batch(x, arg, axis, value.shape[0], "positions")


def _tables(xp: Any, positions: Any, freqs: _Frequencies, dtype: Any, device: Any) -> tuple[Any, Any]:
    return cos_sin(xp, positions, freqs.inv_freq, dtype=dtype, device=device, scale=freqs.scale)


def _check_batch(x: Any, arg: str, axis: int, batch: int, source: str) -> None:
    if x.ndim + axis < 1:
        raise ValueError(
            f"per-row {source} align with {arg}'s first axis, but {arg} of shape {tuple(x.shape)} has "
            "no batch axis before its sequence axis"
        )
    if batch not in (1, x.shape[0]):
        raise ValueError(
            f"{source} has {batch} rows but {arg} has batch size {x.shape[0]} (axis 0); give one row "
            "per batch entry"
        )
