"""Whether a stream is a terminal worth drawing on; and what gpudoctor writes on one carries no control character of
its inputs: a script's path, an exception's message, a received bundle's or findings.json's titles could otherwise
move the cursor, retitle the window or switch its screen (`ESC ] 0 ; ... BEL`, `ESC [ ? 1049 h`). Each control
character but a newline and a tab is written as its escape, `\\x1b`, which shows what the input held and does
nothing. gpudoctor's own status line writes its escapes apart (gpudoctor.ui.status_line)."""

from __future__ import annotations

import os
import re
import sys
from typing import IO, TextIO

# C0 controls but tab and newline, DEL, and the C1 controls (U+0080-U+009F: a terminal may take U+009B as CSI)
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def terminal_safe(text: str) -> str:
    return CONTROL.sub(lambda found: f"\\x{ord(found.group()):02x}", text)


def write(text: str, stream: TextIO | None = None, end: str = "\n") -> None:
    """`text`, made terminal-safe, on `stream` (standard error by default)."""
    print(terminal_safe(text), file=sys.stderr if stream is None else stream, end=end)


def is_terminal(stream: IO[str] | None) -> bool:
    """True for a terminal that understands escape codes (TERM is not "dumb"); False when piped or redirected."""
    try:
        return stream is not None and stream.isatty() and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError, OSError):
        return False
