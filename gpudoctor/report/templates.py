"""The jinja environment the report and the comparison are rendered in: the shipped templates, escaped, strict about
names they do not define, and their compiled code kept between runs, so that a run does not compile them again."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import jinja2
from jinja2.bccache import Bucket

from gpudoctor.paths import templates_dir


def template_environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        autoescape=jinja2.select_autoescape(enabled_extensions=("html", "j2"), default_for_string=True),
        undefined=jinja2.StrictUndefined,
        bytecode_cache=_compiled_templates(),
    )


class _BestEffortCache(jinja2.FileSystemBytecodeCache):
    """A template's code from an earlier run, when it is there and whole; a cache that cannot be read or written is
    no cache (the template is compiled again), never an error. Jinja checks the template's source and the Python
    version against what it stored."""

    def load_bytecode(self, bucket: Bucket) -> None:
        try:
            super().load_bytecode(bucket)
        except Exception:  # noqa: BLE001 - unreadable, or its header not jinja's pickle: compiled again
            bucket.reset()

    def dump_bytecode(self, bucket: Bucket) -> None:
        with contextlib.suppress(OSError):
            super().dump_bytecode(bucket)


def _compiled_templates() -> jinja2.BytecodeCache | None:
    """The user's cache directory for compiled templates (one per jinja version), or None where it cannot be made."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    directory = root / "gpudoctor" / f"templates-jinja2-{jinja2.__version__}"
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except (OSError, RuntimeError):  # RuntimeError: no home directory to be found
        return None
    return _BestEffortCache(str(directory))
