"""Reading values out of a model config with checks: every malformed value is a ValueError or
TypeError that names its key and says what was wanted, never a raw Python error or a silent
default.

A config is a ``config.json`` dict or a transformers config object. Objects are read through
their attributes, so a family's aliases resolve as transformers resolves them (GPT-J's
``n_embd`` answers ``hidden_size``); dicts through their keys, and the aliases a family declares.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ._args import check_number, check_numbers

__all__ = ["MISSING", "ConfigReader"]

MISSING: Any = object()


class ConfigReader:
    """Checked access to one config's values (``where`` names it in messages: "the config",
    "rope_parameters")."""

    def __init__(
        self, config: Any, *, where: str = "the config", aliases: Mapping[str, str] | None = None
    ) -> None:
        self.where = where
        self._aliases = dict(aliases or {})
        if isinstance(config, Mapping):
            self._object, self._dict = None, dict(config)
        elif callable(getattr(config, "to_dict", None)):  # a transformers PretrainedConfig
            self._object, self._dict = config, dict(config.to_dict())
        else:
            raise TypeError(
                f"config must be a config.json dict or a transformers config object, not {type(config).__name__}"
            )

    @property
    def source(self) -> Any:
        """The config object, or the dict."""
        return self._object if self._object is not None else self._dict

    def names(self) -> list[str]:
        """The keys the config holds (a config object's serialised keys)."""
        return list(self._dict)

    def has(self, key: str) -> bool:
        return self.get(key) is not MISSING

    def get(self, key: str, default: Any = MISSING) -> Any:
        """The value under ``key``'s alias (None included), else under ``key``, else ``default``.
        The alias wins: it names the key the family's code reads (SeamlessM4T's speech encoder
        reads ``speech_encoder_attention_heads``, not the decoder's ``num_attention_heads``)."""
        names = [name for name in (self._aliases.get(key), key) if name is not None]
        if self._object is not None:
            for name in names:
                value = getattr(self._object, name, MISSING)
                if value is not MISSING:
                    return value
        for name in names:
            if name in self._dict:
                return self._dict[name]
        return default

    def sub(self, key: str) -> ConfigReader | None:
        """A nested config (``text_config``, a ``rope_parameters`` dict) as a reader, or None."""
        value = self.get(key)
        if value is MISSING or value is None:
            return None
        if not isinstance(value, Mapping) and not callable(getattr(value, "to_dict", None)):
            raise TypeError(f"{self._name(key)} must be a dict, got {type(value).__name__}")
        return ConfigReader(value, where=key)

    def _name(self, key: str) -> str:
        return f"{key!r} in {self.where}" if self.where != "the config" else f"the config's {key!r}"

    def integer(self, key: str, default: Any = MISSING, *, low: int = 1) -> Any:
        """An int of at least ``low`` (integral floats such as 128.0 pass; 64.5, strings and bools
        do not), or ``default`` where the key is absent or None."""
        value = self.get(key)
        if value is MISSING or value is None:
            if default is MISSING:
                raise ValueError(f"{self.where} needs {key!r}")
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{self._name(key)} is {value!r}; it must be an int, not {type(value).__name__}")
        if isinstance(value, float) and not value.is_integer():
            raise ValueError(f"{self._name(key)} is {value!r}; it must be a whole number")
        if value < low:
            raise ValueError(f"{self._name(key)} is {value!r}; it must be at least {low}")
        return int(value)

    def number(
        self,
        key: str,
        default: Any = MISSING,
        *,
        low: float = 0.0,
        strict: bool = True,
        allow_none: bool = False,
    ) -> Any:
        """A finite float above ``low`` (``strict``) or at least it, or ``default`` where the key is
        absent (or None, where ``allow_none``: transformers' way to say "unset" for some keys)."""
        value = self.get(key)
        if value is MISSING or (value is None and allow_none):
            if default is MISSING:
                raise ValueError(f"{self.where} needs {key!r}")
            return default
        return check_number(value, self._name(key), low=low, strict=strict)

    def boolean(self, key: str, default: Any = MISSING) -> Any:
        """True or False (a string such as "false" is refused: it would read as True)."""
        value = self.get(key)
        if value is MISSING or value is None:
            if default is MISSING:
                raise ValueError(f"{self.where} needs {key!r}")
            return default
        if not isinstance(value, bool):
            raise TypeError(f"{self._name(key)} is {value!r}; it must be true or false")
        return value

    def numbers(self, key: str, length: int | None = None) -> tuple[float, ...]:
        """A list of positive finite numbers (of ``length`` entries, where given)."""
        value = self.get(key)
        if value is MISSING or value is None:
            raise ValueError(f"{self.where} needs {key!r}")
        if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence):  # JSON lists only
            raise TypeError(f"{self._name(key)} must be a list of numbers, got {type(value).__name__}")
        return check_numbers(value, self._name(key), length=length)
