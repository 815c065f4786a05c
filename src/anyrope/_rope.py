"""The :class:`RoPE` object: a configuration plus cached tables, callable on q and k."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from ._args import check_float_vector, check_int, check_positive
from ._call import cos_sin, rope_call
from ._frequencies import Spectrum
from ._hf import layer_count, parse_hf_config
from ._layout import check_rotary_dim, normalize_layout
from ._rotary import Rotary
from ._sections import axial_sections, check_sections, check_stream_map
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
    pair_streams : sequence of int, optional
        Any assignment of pairs to position streams, one entry per pair (``rotary_dim // 2``):
        pair ``j`` turns by ``positions[pair_streams[j]] * theta``. M-RoPE and axial RoPE are
        named cases of it (their :attr:`pair_streams` built this way give the same RoPE); others
        are, for instance, ERNIE 4.5-VL's (height and width alternate over the first pairs, time
        takes the rest). Calls take positions of shape ``(streams, ...)`` with
        ``streams = max(pair_streams) + 1``.
    pair_frequencies : sequence of int, optional
        With ``pair_streams``: the frequency pair ``j`` turns by, as an index into the spectrum
        (``inv_freq[pair_frequencies[j]]``); by default its own, ``j``.
    frequency_scale : sequence of float or 1-D array, optional
        Multipliers of the frequencies, one per frequency index (``rotary_dim // 2``, positive
        and finite), applied after ``scaling``: frequency ``i`` becomes ``inv_freq[i] *
        frequency_scale[i]`` (Mistral Large 4's learned ``exp(alpha)``). Indexed like
        :attr:`inv_freq`, so with ``axial`` or ``pair_frequencies`` pair ``j`` turns by
        ``inv_freq[pair_frequencies[j]]`` with the scale already in it. A NumPy array or a
        tensor of any device is read once, here, into Python floats.

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

    __slots__ = ("_rotary",)  # everything else reads this one frozen value

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
        pair_streams: Sequence[int] | None = None,
        pair_frequencies: Sequence[int] | None = None,
        frequency_scale: Any = None,
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
        if pair_streams is not None:
            if sections is not None:
                raise ValueError(
                    "pass pair_streams, mrope_section or axial, not two of them (each says which "
                    "stream a pair follows)"
                )
            sections = check_stream_map(pair_streams, pair_frequencies, rotary_dim)
        elif pair_frequencies is not None:
            raise ValueError("pair_frequencies needs pair_streams= (the stream each pair follows)")
        if xpos_scale_base is not None:
            xpos_scale_base = check_positive(xpos_scale_base, "xpos_scale_base", why=" (512 in xPos) or None")
            if sections is not None:
                raise ValueError(
                    "xpos_scale_base does not combine with mrope_section, axial or pair_streams: xPos scales by one position"
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
        method: Scaling = scaling if scaling is not None else Scaling()
        scale = None if frequency_scale is None else _checked_scale(frequency_scale, rotary_dim)
        self._rotary = Rotary(
            head_dim=head_dim, rotary_dim=rotary_dim, base=float(base), layout=normalize_layout(layout),
            clockwise=clockwise, scaling=method, max_position=max_position, sections=sections,
            xpos_scale_base=xpos_scale_base,
            spectrum=Spectrum(method, rotary_dim, float(base), max_position, None, scale),
        )  # fmt: skip

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
        rotates (see the model-family table in the docs) and reads the rest the way Llama does,
        with a ``UserWarning`` that names the ``model_type`` and says what it assumed, unless
        ``layout=`` pins the pairing. A dict without ``model_type`` is read that way
        silently.

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
            Override the family's pairing, e.g. "interleaved" for a checkpoint kept in Meta's layout,
            or pin the pairing of a model family anyrope does not know.
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
        return cls(**parse_hf_config(config, layer_type=layer_type, layer=layer, layout=layout))

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
        layers: list[RoPE | None] = []
        for index in range(layer_count(config)):
            try:
                layers.append(cls.from_hf_config(config, layout=layout, layer=index))
            except ValueError as exc:
                if "has no rotary embedding" not in str(exc):
                    raise
                layers.append(None)
        return layers

    head_dim = property(lambda self: self._rotary.head_dim, doc="Features per head.")
    rotary_dim = property(lambda self: self._rotary.rotary_dim, doc="Rotated features per head.")
    base = property(lambda self: self._rotary.base, doc="The frequency base.")
    layout = property(lambda self: self._rotary.layout, doc='The canonical layout, "half" or "interleaved".')
    clockwise = property(lambda self: self._rotary.clockwise, doc="Whether pairs turn by -position * theta.")

    @property
    def mrope_section(self) -> tuple[int, ...] | None:
        """Frequency pairs per position stream (M-RoPE), or None (also for axial RoPE and other
        stream maps: see :attr:`pair_streams`)."""
        sections = self._rotary.sections
        return (
            sections.sizes if sections is not None and not sections.axial and sections.kind != "map" else None
        )

    @property
    def axial(self) -> int | None:
        """The number of axes of axial RoPE, or None."""
        sections = self._rotary.sections
        return sections.streams if sections is not None and sections.axial else None

    @property
    def axial_frequencies(self) -> str | None:
        """How axial RoPE shares the frequencies out ("blocks" or "alternating"), or None."""
        sections = self._rotary.sections
        return sections.kind if sections is not None and sections.axial else None

    @property
    def mrope_interleaved(self) -> bool:
        """Whether M-RoPE's streams are spread across the pairs (Qwen3-VL) rather than contiguous."""
        return self._rotary.sections is not None and self._rotary.sections.interleaved

    xpos_scale_base = property(
        lambda self: self._rotary.xpos_scale_base, doc="xPos's scale base, or None without xPos."
    )

    @property
    def pair_streams(self) -> tuple[int, ...]:
        """The position stream each frequency pair follows (all 0 with one stream).

        >>> import anyrope
        >>> anyrope.RoPE(16, mrope_section=[4, 2, 2], mrope_interleaved=True).pair_streams
        (0, 1, 2, 0, 1, 2, 0, 0)
        """
        return self._rotary.pair_streams

    @property
    def pair_frequencies(self) -> tuple[int, ...]:
        """The frequency each pair turns by, as an index into the spectrum of ``rotary_dim``
        (pair ``j`` turns by ``inv_freq[pair_frequencies[j]]``): ``0, 1, ...`` but for axial RoPE.

        >>> import anyrope
        >>> anyrope.RoPE(16, axial=2, axial_frequencies="alternating").pair_frequencies
        (0, 2, 4, 6, 1, 3, 5, 7)
        """
        return self._rotary.pair_frequencies

    @property
    def streams(self) -> int:
        """Positions per token: ``len(mrope_section)`` for M-RoPE, ``axial`` for axial RoPE,
        ``max(pair_streams) + 1`` for another stream map, else 1."""
        return self._rotary.streams

    @property
    def scaling(self) -> Scaling | None:
        """The long-context scaling, or None for plain RoPE."""
        return None if type(self._rotary.scaling) is Scaling else self._rotary.scaling

    max_position = property(
        lambda self: self._rotary.max_position, doc="The expected longest context, or None."
    )

    @property
    def inv_freq(self) -> tuple[float, ...]:
        """Radians per position of each pair, as float64 Python floats (``rotary_dim // 2`` of them),
        with :attr:`frequency_scale` applied where there is one.

        For methods that change with the sequence (``DynamicNTK``, ``LongRoPE``) these are the
        frequencies within the original context; see :meth:`inv_freq_at`.
        """
        return self._rotary.spectrum.at(None).inv_freq

    @property
    def frequency_scale(self) -> tuple[float, ...] | None:
        """The per-frequency multipliers the frequencies carry (already in :attr:`inv_freq`), or None."""
        return self._rotary.spectrum.frequency_scale

    def with_frequency_scale(self, frequency_scale: Any) -> RoPE:
        """This RoPE with its frequencies (the scaling method's) times ``frequency_scale``, which
        replaces any earlier one; None removes it. For a scale held in a checkpoint rather than
        in the config, such as Mistral Large 4's ``exp(rotary_emb.alpha)``.

        >>> import anyrope
        >>> rope = anyrope.RoPE(8).with_frequency_scale([1.0, 2.0, 1.0, 0.5])
        >>> rope.inv_freq == (1.0, 0.2, 0.01, 0.0005)
        True
        """
        scale = None if frequency_scale is None else _checked_scale(frequency_scale, self.rotary_dim)
        return _wrap(self._rotary.with_frequency_scale(scale))

    def inv_freq_at(self, seq_len: int) -> tuple[float, ...]:
        """The frequencies used for a sequence of ``seq_len`` positions (``max(positions) + 1``)."""
        return self._rotary.spectrum.at(check_int(seq_len, "seq_len", low=0)).inv_freq

    @property
    def attention_scaling(self) -> float:
        """The factor the tables, and so the rotated q and k, carry (logits scale by its square).

        1.0 for plain RoPE; YaRN's and LongRoPE's attention factors otherwise, as in transformers.
        """
        return self._rotary.spectrum.at(None).scale

    @property
    def fixed_length(self) -> int | None:
        """The sequence length whose frequencies every call uses (see :meth:`at_length`), or None."""
        return self._rotary.spectrum.fixed

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
        return _wrap(self._rotary.at_length(check_int(seq_len, "seq_len", low=1)))

    def _replace(self, **changes: Any) -> RoPE:
        """This RoPE with some of its description replaced, unchecked (for the integrations)."""
        return _wrap(dataclasses.replace(self._rotary, **changes))

    def __repr__(self) -> str:
        r = self._rotary
        parts = [f"{r.head_dim}", f"base={r.base!r}"]
        if r.rotary_dim != r.head_dim:
            parts.append(f"rotary_dim={r.rotary_dim}")
        parts.append(f"layout={r.layout!r}")
        if self.scaling is not None:
            parts.append(f"scaling={self.scaling!r}")
        if r.max_position is not None:
            parts.append(f"max_position={r.max_position}")
        if r.clockwise:
            parts.append("clockwise=True")
        if r.sections is not None and r.sections.axial:
            parts.append(f"axial={r.sections.streams}, axial_frequencies={r.sections.kind!r}")
        elif r.sections is not None and r.sections.kind == "map":
            parts.append(f"pair_streams={list(r.sections.stream_of)}")
            if r.sections.reordered:
                parts.append(f"pair_frequencies={list(r.sections.freq_of)}")
        elif r.sections is not None:
            parts.append(f"mrope_section={list(r.sections.sizes)}")
            if r.sections.interleaved:
                parts.append("mrope_interleaved=True")
        if r.xpos_scale_base is not None:
            parts.append(f"xpos_scale_base={r.xpos_scale_base!r}")
        if r.spectrum.frequency_scale is not None:
            parts.append(f"frequency_scale={list(r.spectrum.frequency_scale)!r}")
        text = f"RoPE({', '.join(parts)})"
        return text if r.spectrum.fixed is None else f"{text}.at_length({r.spectrum.fixed})"

    def cos_sin(self, positions: Any, *, like: Any) -> tuple[Any, Any]:
        """Compact tables for ``positions``: shape ``positions.shape + (rotary_dim // 2,)``.

        They come in ``like``'s library, device and dtype, ready for :func:`anyrope.apply`
        (for a ``clockwise`` RoPE, sin is negated: the angles are ``-position * theta``).
        Angles are formed exactly on the device (see the positions guide) and only the final
        values are cast; positions may be any integers, and any integer array of ``like``'s library.
        For M-RoPE, positions of more than one axis have the streams first, ``(streams, ...)``,
        and the tables have shape ``positions.shape[1:] + (rotary_dim // 2,)``.
        """
        return cos_sin(self._rotary, positions, like)

    def __call__(
        self,
        q: Any,
        k: Any = None,
        *,
        positions: Any = None,
        offset: Any = 0,
        seq_axis: int = -2,
        inplace: bool = False,
        inverse: bool = False,
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
        inverse : bool
            Turn by minus the angles at these positions: undoes a rotation, for any array
            (values, attention outputs). DeepSeek-V4 rotates its values by the keys' positions
            and turns each attention output back by its query's position; for a ``clockwise``
            RoPE it turns by plus the angles.

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
        return rope_call(self._rotary, q, k, positions, offset, seq_axis, inplace, inverse)


def _checked_scale(frequency_scale: Any, rotary_dim: int) -> tuple[float, ...]:
    """``frequency_scale`` as Python floats, one per frequency, or an error naming it."""
    pairs = rotary_dim // 2
    why = f" (rotary_dim // 2 = {pairs} entries, one per frequency)"
    return check_float_vector(frequency_scale, "frequency_scale", length=pairs, why=why)


def _wrap(rotary: Rotary) -> RoPE:
    """A RoPE holding ``rotary`` (already checked)."""
    rope = object.__new__(RoPE)
    rope._rotary = rotary
    return rope


def rotary_of(rope: RoPE) -> Rotary:
    """What ``rope`` is, for the functions of the public API beside it (:func:`anyrope.rerotate`)."""
    return rope._rotary
