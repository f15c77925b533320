"""What every bundle record shares: msgspec Structs, validated when decoded, and the number types they use.

A field added in a later version of the format has a default, so that older bundles still load. "Not
measured" is None, never zero.
"""

from __future__ import annotations

import re
from typing import Annotated, cast

import msgspec

# Durations, sizes and counts are never negative; a file that says otherwise is corrupt.
Seconds = Annotated[float, msgspec.Meta(ge=0)]
Count = Annotated[int, msgspec.Meta(ge=0)]


class Record(msgspec.Struct, kw_only=True, frozen=True):
    """A record of a bundle file; unknown keys (from a newer gpudoctor) are ignored.

    Every subclass says `frozen=True` again: msgspec inherits it, but a type checker reads it class by class.
    """

    def to_json(self) -> dict[str, object]:
        """The record as plain JSON data (dicts, lists, numbers, strings)."""
        return cast("dict[str, object]", msgspec.to_builtins(self))  # a Struct becomes an object


class Event(msgspec.Struct, kw_only=True, frozen=True, tag_field="kind", omit_defaults=True):
    """An events.jsonl record: its class's tag is its `kind`. Every event has its time `t` (seconds since the
    epoch), set by the recorder when it is written."""


class Site(Record, frozen=True):
    """A line in the user's code: where a loader was built, a copy made, a thread started."""

    file: str
    line: int = 0
    function: str = ""


# Code that torch.compile writes and imports from its cache (TorchInductor's `torchinductor_<user>` folder, where
# recompiles_bad showed a sixth of its host samples in `/tmp/torchinductor_root/6e/c6ep....py:123 in call`), and
# Triton's: it runs the script's model, but no line of it is the user's to change.
GENERATED_CODE_DIRS = ("torchinductor_", ".triton")


def generated_code(file: str) -> bool:
    """Whether `file` is code torch.compile generated into its cache (GENERATED_CODE_DIRS): never a line of the
    user's, though it lies outside torch and every installed package."""
    return any(part.startswith(GENERATED_CODE_DIRS) for part in file.replace("\\", "/").split("/")[:-1])


_TERMINAL_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def first_line(message: str | None, limit: int = 200) -> str:
    """An exception's message as a sentence quotes it: its first line, without terminal colour codes or the spaces
    around it ('' for none). A longer line than `limit` characters ends at its last whole sentence within them
    (CUDA's out-of-memory message runs on for 400), else at a word, with '…'; a line of one word is cut."""
    lines = _TERMINAL_ESCAPE.sub("", message or "").strip().splitlines()
    line = lines[0].strip() if lines else ""
    if len(line) <= limit:
        return line
    kept = line[:limit + 1]
    sentence = kept.rfind(". ")
    if sentence > 0:
        return kept[:sentence + 1]
    word = kept.rfind(" ")
    return kept[:word].rstrip(",;:") + "…" if word > 0 else line[:limit]
