"""Reversible attribute patches: install a wrapper, and put back exactly what was there.

Every wrapper carries the identity of what it wraps (name, qualname, docstring, module, `__wrapped__`), so that
a library that introspects a patched torch API (Lightning reads `inspect.signature(DataLoader.__init__)` to
rebuild loaders) sees the original.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

_MISSING = object()


class Patches:
    def __init__(self) -> None:
        self._undo: list[tuple[Any, str, Any]] = []
        self._originals: list[tuple[Any, str, Any]] = []

    def wrap(self, owner: Any, name: str, make_wrapper: Callable[[Any], Any]) -> None:
        """Replace owner.name with make_wrapper(original), which takes the original's identity."""
        original = getattr(owner, name)
        own = owner.__dict__.get(name, _MISSING) if isinstance(owner, type) else getattr(owner, name)
        self._undo.append((owner, name, own))
        self._originals.append((owner, name, original))
        setattr(owner, name, _with_identity(make_wrapper(original), original))

    def patched(self) -> list[tuple[Any, str, Any]]:
        """(owner, name, original) of every patch in place, in the order they were made."""
        return list(self._originals)

    def restore(self) -> None:
        while self._undo:
            owner, name, own = self._undo.pop()
            self._originals.pop()
            if own is _MISSING:
                delattr(owner, name)  # the attribute was inherited: remove the override
            else:
                setattr(owner, name, own)


def _with_identity(wrapper: Any, original: Any) -> Any:
    """`wrapper` with the name, qualname, docstring and module of `original`, and `__wrapped__` (which
    inspect.signature follows). A C method has no __module__: the wrapper then has None, as it reads."""
    functools.update_wrapper(wrapper, original)
    if not hasattr(original, "__module__"):
        wrapper.__module__ = None
    return wrapper
