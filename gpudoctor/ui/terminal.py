"""Whether a stream is a terminal worth drawing on."""

from __future__ import annotations

import os
from typing import IO


def is_terminal(stream: IO[str] | None) -> bool:
    """True for a terminal that understands escape codes (TERM is not "dumb"); False when piped or redirected."""
    try:
        return stream is not None and stream.isatty() and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError, OSError):
        return False
