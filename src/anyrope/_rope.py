"""The :class:`RoPE` object: a configuration plus cached tables, callable on q and k."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._args import check_int, check_positive
from ._cache import table_cache, untracked
from ._compat import Environment, array_namespace, device_of, environment, is_array, is_traced, materialize
from ._dtypes import compute_dtype, isdtype
from ._frequencies import Frequencies, LengthSwitch, Spectrum
from ._layout import Layout, check_rotary_dim, normalize_layout
from ._plan import rope_call
from ._positions import Offset, position_spec
from ._sections import axial_sections, check_sections
from .scaling import Scaling

__all__ = ["RoPE"]


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
    clockwise : bool
        Turn each pair the other way, by ``-position * theta`` (NanoChat's ``rotate_half`` is
        ``cat(x2, -x1)``). Scores still depend on relative position only, with its sign flipped.
    mrope_section : sequence of int, optional
        M-RoPE (Qwen2-VL and later vision-language models): tokens carry one position per stream
        (time, height, width), and ``mrope_section[s]`` frequency pairs follow stream ``s``; the
        entries add up to ``rotary_dim // 2``. Calls then take positions of shape
        ``(streams, seq)`` or ``(streams, batch, seq)``; 1-D positions and offsets give every
        stream the same positions, which is plain RoPE (text tokens).
    axial : int, optional
        Axial RoPE for images and video (vision transformers): each token has one position per
        axis (row and column; or frame, row, column), and each axis takes an equal contiguous
        share of the pairs. Calls take positions of shape ``(axial, seq)`` or ``(axial, batch,
        seq)``; :func:`anyrope.grid_positions` makes them for a patch grid.
    axial_frequencies : str
        How the axes share the frequencies out: "blocks" (each axis the spectrum of
        ``rotary_dim / axial`` features: EVA-02, Llama 4 vision, rotary-embedding-torch's axial) or
        "alternating" (the whole spectrum dealt out in turn: Pixtral's rows take the even
        frequencies, its columns the odd ones).
    xpos_scale_base : float, optional
        xPos (Sun et al., 2022): q's pair ``i`` at position ``m`` is also scaled by
        ``zeta_i ** (m / xpos_scale_base)`` and k's at ``n`` by ``zeta_i ** (-n / xpos_scale_base)``,
        ``zeta_i = (2i / rotary_dim + 0.4) / 1.4``, so scores decay with distance, slow pairs
        least (rotary-embedding-torch's ``use_xpos``, whose default is 512). Calls then need q
        and k together. A key's scale grows as ``zeta ** (-n / xpos_scale_base)``: past
        float32's range beyond ``n`` of about 70 times ``xpos_scale_base`` (float64: 560 times).
    mrope_interleaved : bool
        Spread the streams across the pairs (Qwen3-VL: stream ``s > 0`` takes pairs ``s, s +
        streams, ...``, ``mrope_section[s]`` of them; the rest follow stream 0) instead of
        contiguous sections (Qwen2-VL: the first ``mrope_section[0]`` pairs follow stream 0, ...).

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
        "_clockwise",
        "_head_dim",
        "_layout",
        "_max_position",
        "_rotary_dim",
        "_scaling",
        "_sections",
        "_spectrum",
        "_xpos",
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
        clockwise: bool = False,
        mrope_section: Sequence[int] | None = None,
        mrope_interleaved: bool = False,
        axial: int | None = None,
        axial_frequencies: str = "blocks",
        xpos_scale_base: float | None = None,
    ) -> None:
        if not isinstance(clockwise, bool):
            raise TypeError(f"clockwise must be True or False, not {clockwise!r}")
        head_dim = check_int(head_dim, "head_dim", low=1, even=True, why=" (features rotate in pairs)")
        rotary_dim = check_rotary_dim(head_dim if rotary_dim is None else rotary_dim, head_dim)
        sections = check_sections(mrope_section, mrope_interleaved, rotary_dim)
        if axial is not None:
            if sections is not None:
                raise ValueError(
                    "pass mrope_section or axial, not both (each says which stream a pair follows)"
                )
            sections = axial_sections(axial, axial_frequencies, rotary_dim)
        elif axial_frequencies != "blocks":
            raise ValueError(f"axial_frequencies={axial_frequencies!r} needs axial= (the number of axes)")
        if xpos_scale_base is not None:
            xpos_scale_base = check_positive(xpos_scale_base, "xpos_scale_base", why=" (512 in xPos) or None")
            if sections is not None:
                raise ValueError(
                    "xpos_scale_base does not combine with mrope_section or axial: xPos scales by one position"
                )
        base = check_positive(base, "base", why=" (10000.0 in most models)")
        if max_position is not None:
            max_position = check_int(max_position, "max_position", low=1, why=" or None")
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
        self._clockwise = clockwise
        self._sections = sections
        self._xpos = xpos_scale_base
        self._scaling: Scaling = scaling if scaling is not None else Scaling()
        self._spectrum = Spectrum(self._scaling, rotary_dim, self._base, max_position, None)

    @classmethod
    def from_hf_config(
        cls,
        config: Any,
        *,
        layout: str | None = None,
        layer_type: str | None = None,
        layer: int | None = None,
    ) -> RoPE:
        """The RoPE a Hugging Face model was trained with, from its config.

        The model family (``model_type``) says how it pairs features, which key sets the rotated
        width, and which layers rotate at all: anyrope knows every transformers family that
        rotates (see the model-family table in the docs) and reads the rest the way Llama does.

        Parameters
        ----------
        config : dict or transformers config
            A ``config.json`` as a dict, or a ``transformers.PretrainedConfig`` (read through its
            attributes, so aliases such as GPT-J's ``n_embd`` resolve); a multimodal config's
            ``text_config`` is read. Read: the head width (``head_dim``, ``hidden_size /
            num_attention_heads``, DeepSeek's ``qk_rope_head_dim``), the rotated width
            (``partial_rotary_factor``, ``rotary_pct``, GPT-J's ``rotary_dim``), ``rope_theta``,
            ``rope_scaling`` (old, with ``type`` or ``rope_type``) or ``rope_parameters`` (v5),
            ``max_position_embeddings``, ``original_max_position_embeddings``, ``rope_interleave``,
            and M-RoPE's ``mrope_section`` (Qwen2-VL's contiguous sections or Qwen3-VL's
            interleaved streams, as the family's own code reads them).
        layout : str, optional
            Override the family's pairing, e.g. "interleaved" for a checkpoint kept in Meta's layout.
        layer_type : str, optional
            For configs with RoPE parameters per layer type (Gemma 3's "sliding_attention" and
            "full_attention").
        layer : int, optional
            The RoPE of one layer (its type and theta taken from the config); a ValueError says so
            where that layer does not rotate (Llama 4's and SmolLM3's NoPE layers, Cohere 2's
            global layers, ...). :meth:`layers_from_hf_config` lists every layer.

        Raises
        ------
        ValueError, TypeError
            For a malformed value, naming its key; for a ``rope_type`` or a family anyrope does
            not implement, naming it and why.

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
        >>> anyrope.RoPE.from_hf_config({"model_type": "cohere", "hidden_size": 256,
        ...                              "num_attention_heads": 4}).layout
        'interleaved'
        """
        from ._hf import parse_hf_config

        kwargs = parse_hf_config(config, layer_type=layer_type, layer=layer)
        if layout is not None:
            kwargs["layout"] = layout
        return cls(**kwargs)

    @classmethod
    def layers_from_hf_config(cls, config: Any, *, layout: str | None = None) -> list[RoPE | None]:
        """One entry per layer of the model (``num_hidden_layers``): its RoPE, or None where the
        layer does not rotate (NoPE layers, and layers without attention in hybrid models).

        >>> import anyrope
        >>> ropes = anyrope.RoPE.layers_from_hf_config({
        ...     "model_type": "smollm3", "hidden_size": 256, "num_attention_heads": 4,
        ...     "num_hidden_layers": 4, "no_rope_layers": [1, 1, 1, 0], "rope_theta": 2e6})
        >>> [rope is not None for rope in ropes]
        [True, True, True, False]
        """
        from ._hf import layer_count

        layers: list[RoPE | None] = []
        for index in range(layer_count(config)):
            try:
                layers.append(cls.from_hf_config(config, layout=layout, layer=index))
            except ValueError as exc:
                if "has no rotary embedding" not in str(exc):
                    raise
                layers.append(None)
        return layers

    head_dim = property(lambda self: self._head_dim, doc="Features per head.")
    rotary_dim = property(lambda self: self._rotary_dim, doc="Rotated features per head.")
    base = property(lambda self: self._base, doc="The frequency base.")
    layout = property(lambda self: self._layout, doc='The canonical layout, "half" or "interleaved".')
    clockwise = property(lambda self: self._clockwise, doc="Whether pairs turn by -position * theta.")

    @property
    def mrope_section(self) -> tuple[int, ...] | None:
        """Frequency pairs per position stream (M-RoPE), or None."""
        return None if self._sections is None or self._sections.axial else self._sections.sizes

    @property
    def axial(self) -> int | None:
        """The number of axes of axial RoPE, or None."""
        return self._sections.streams if self._sections is not None and self._sections.axial else None

    @property
    def axial_frequencies(self) -> str | None:
        """How axial RoPE shares the frequencies out ("blocks" or "alternating"), or None."""
        return self._sections.kind if self._sections is not None and self._sections.axial else None

    @property
    def mrope_interleaved(self) -> bool:
        """Whether M-RoPE's streams are spread across the pairs (Qwen3-VL) rather than contiguous."""
        return self._sections is not None and self._sections.interleaved

    xpos_scale_base = property(lambda self: self._xpos, doc="xPos's scale base, or None without xPos.")

    @property
    def pair_streams(self) -> tuple[int, ...]:
        """The position stream each frequency pair follows (all 0 with one stream).

        >>> import anyrope
        >>> anyrope.RoPE(16, mrope_section=[4, 2, 2], mrope_interleaved=True).pair_streams
        (0, 1, 2, 0, 1, 2, 0, 0)
        """
        return (0,) * (self._rotary_dim // 2) if self._sections is None else self._sections.stream_of

    @property
    def pair_frequencies(self) -> tuple[int, ...]:
        """The frequency each pair turns by, as an index into the spectrum of ``rotary_dim``
        (pair ``j`` turns by ``inv_freq[pair_frequencies[j]]``): ``0, 1, ...`` but for axial RoPE.

        >>> import anyrope
        >>> anyrope.RoPE(16, axial=2, axial_frequencies="alternating").pair_frequencies
        (0, 2, 4, 6, 1, 3, 5, 7)
        """
        return tuple(range(self._rotary_dim // 2)) if self._sections is None else self._sections.freq_of

    @property
    def streams(self) -> int:
        """Positions per token: ``len(mrope_section)`` for M-RoPE, ``axial`` for axial RoPE, else 1."""
        return 1 if self._sections is None else self._sections.streams

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
        return self._spectrum.at(None).inv_freq

    def inv_freq_at(self, seq_len: int) -> tuple[float, ...]:
        """The frequencies used for a sequence of ``seq_len`` positions (``max(positions) + 1``)."""
        return self._spectrum.at(check_int(seq_len, "seq_len", low=0)).inv_freq

    @property
    def attention_scaling(self) -> float:
        """The factor the tables, and so the rotated q and k, carry (logits scale by its square).

        1.0 for plain RoPE; YaRN's and LongRoPE's attention factors otherwise, as in transformers.
        """
        return self._spectrum.at(None).scale

    @property
    def fixed_length(self) -> int | None:
        """The sequence length whose frequencies every call uses (see :meth:`at_length`), or None."""
        return self._spectrum.fixed

    def at_length(self, seq_len: int) -> RoPE:
        """This RoPE with the frequencies of ``seq_len`` fixed for every call.

        ``DynamicNTK`` and ``LongRoPE`` choose their frequencies from ``max(positions) + 1``, so
        keys cached at a shorter length carry other angles than later queries (see
        :func:`anyrope.rerotate`). Fixing the length up front, as vLLM does with
        ``max_position_embeddings * factor``, keeps every cached key valid and needs no look at the
        positions at all, at the price of scaled frequencies for short sequences too.

        >>> import anyrope
        >>> from anyrope.scaling import DynamicNTK
        >>> rope = anyrope.RoPE(8, scaling=DynamicNTK(2.0, original_max_position=16))
        >>> static = rope.at_length(64)
        >>> static.inv_freq == rope.inv_freq_at(64)
        True
        """
        seq_len = check_int(seq_len, "seq_len", low=1)
        spectrum = Spectrum(self._scaling, self._rotary_dim, self._base, self._max_position, seq_len)
        return self._copy(_spectrum=spectrum)

    def _copy(self, **changes: Any) -> RoPE:
        """This RoPE with some slots replaced (its spectrum is shared unless replaced)."""
        copy = object.__new__(RoPE)
        for name in RoPE.__slots__:
            setattr(copy, name, changes.get(name, getattr(self, name)))
        return copy

    def _frequencies_for(self, length: int | None) -> Frequencies | LengthSwitch:
        return self._spectrum.for_call(length)

    def __repr__(self) -> str:
        parts = [f"{self._head_dim}", f"base={self._base!r}"]
        if self._rotary_dim != self._head_dim:
            parts.append(f"rotary_dim={self._rotary_dim}")
        parts.append(f"layout={self._layout!r}")
        if self.scaling is not None:
            parts.append(f"scaling={self.scaling!r}")
        if self._max_position is not None:
            parts.append(f"max_position={self._max_position}")
        if self._clockwise:
            parts.append("clockwise=True")
        if self._sections is not None and self._sections.axial:
            parts.append(f"axial={self._sections.streams}, axial_frequencies={self._sections.kind!r}")
        elif self._sections is not None:
            parts.append(f"mrope_section={list(self._sections.sizes)}")
            if self._sections.interleaved:
                parts.append("mrope_interleaved=True")
        if self._xpos is not None:
            parts.append(f"xpos_scale_base={self._xpos!r}")
        text = f"RoPE({', '.join(parts)})"
        return text if self._spectrum.fixed is None else f"{text}.at_length({self._spectrum.fixed})"

    def cos_sin(self, positions: Any, *, like: Any) -> tuple[Any, Any]:
        """Compact tables for ``positions``: shape ``positions.shape + (rotary_dim // 2,)``.

        They come in ``like``'s library, device and dtype, ready for :func:`anyrope.apply`
        (for a ``clockwise`` RoPE, sin is negated: the angles are ``-position * theta``).
        Angles are formed exactly on the device (see the positions guide) and only the final
        values are cast; positions may be any integers, and any integer array of ``like``'s library.
        For M-RoPE, positions of more than one axis have the streams first, ``(streams, ...)``,
        and the tables have shape ``positions.shape[1:] + (rotary_dim // 2,)``.
        """
        from ._plan import PositionAngles

        if self._xpos is not None:
            raise ValueError(
                "an xPos RoPE scales q and k by different tables, which one pair of cos and sin cannot "
                "give: call rope(q, k)"
            )
        xp = array_namespace(like=like, positions=positions if is_array(positions) else None)
        if not isdtype(xp, like.dtype, "real floating"):
            raise TypeError(f"like must be a real floating-point array, got dtype {like.dtype}")
        device = device_of(xp, like)
        traced = is_traced(xp, like, positions if is_array(positions) else None)
        env = environment(xp, device, traced=traced)
        spec = position_spec(xp, env, positions, 0, device, ndims=None, traced=traced, streams=self.streams)
        angles = PositionAngles(self, xp, env, spec, device, traced, 0)  # explicit positions: no seq
        cos, sin = angles.tables(0, compute_dtype(xp, like.dtype))
        if self._clockwise:
            sin = -sin
        return xp.astype(cos, like.dtype, copy=False), xp.astype(sin, like.dtype, copy=False)

    def _prefix(
        self, xp: Any, env: Environment, freqs: Frequencies, length: int, dtype: Any, device: Any
    ) -> tuple[Any, Any] | None:
        """Cached tables for positions 0 .. length - 1 or more, or None where none are kept."""
        if not self._spectrum.cacheable(freqs):
            return None  # DynamicNTK past the original length: new frequencies at every length
        key = (freqs, env, dtype)  # env: one object per library and device
        found = table_cache.covering(key, length)
        if found is not None:
            return found

        def build(n: int) -> tuple[Any, Any]:
            from ._angles import cos_sin
            from ._plan import scaled

            with untracked(xp):
                positions = Offset(0).positions(xp, env, n, device)
                cos, sin = scaled(
                    cos_sin(xp, env, positions, freqs.inv_freq, dtype=dtype, device=device), freqs.scale
                )
            materialize(xp, cos, sin)  # the cache shares them across threads
            return cos, sin

        row_bytes = self._rotary_dim * (8 if dtype == getattr(xp, "float64", None) else 4)
        return table_cache.prefix(key, length, build, row_bytes=row_bytes, hint=self._max_position or 0)

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
            Integer positions, shape ``(seq,)`` or ``(batch, seq)`` (aligned with the first axis),
            of any integer dtype; negative positions turn the other way. For M-RoPE
            (``mrope_section``), ``(streams, seq)`` or ``(streams, batch, seq)``, as Qwen2-VL's
            ``position_ids``; 1-D positions give every stream the same ones.
        offset : int, array or sequence of int
            Positions ``offset, offset + 1, ...``: the number of tokens already in the KV cache,
            as one int, a 0-d integer array (traced under ``jax.jit``, say), or one per batch
            row (negative for left-padded rows, as mlx-lm's batched cache passes). Ignored when
            ``positions`` is given.
        seq_axis : int
            The sequence axis of q and k.
        inplace : bool
            Overwrite q and k with the result (NumPy, PyTorch and CuPy arrays, not ones that
            require grad): no new memory, and no page faults for it.

        Returns
        -------
        array or (array, array)
            The rotated q, or (q, k), in the inputs' library, device and dtype.

        Notes
        -----
        Only shapes, dtypes and devices are read from arrays on accelerators or under tracing
        (``torch.compile``, ``jax.jit``, ``mx.compile``): angles are formed on the device, and
        ``DynamicNTK`` and ``LongRoPE`` pick their frequencies there. Positions known on the host
        (Python ints, NumPy arrays, CPU tensors) also select cached tables and CPU kernels.
        """
        return rope_call(self, q, k, positions, offset, seq_axis, inplace)
