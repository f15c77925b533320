"""Reversible attribute patches: install a wrapper, and put back exactly what was there."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_MISSING = object()


class Patches:
    def __init__(self) -> None:
        self._undo: list[tuple[Any, str, Any]] = []

    def wrap(self, owner: Any, name: str, make_wrapper: Callable[[Any], Any]) -> None:
        """Replace owner.name with make_wrapper(original)."""
        original = getattr(owner, name)
        own = owner.__dict__.get(name, _MISSING) if isinstance(owner, type) else getattr(owner, name)
        self._undo.append((owner, name, own))
        setattr(owner, name, make_wrapper(original))

    def restore(self) -> None:
        while self._undo:
            owner, name, own = self._undo.pop()
            if own is _MISSING:
                delattr(owner, name)  # the attribute was inherited: remove the override
            else:
                setattr(owner, name, own)
