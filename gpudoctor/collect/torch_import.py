"""Installing the torch hooks right after the script imports torch: gpudoctor never imports it first, so
environment variables the script sets before `import torch` still take effect."""

from __future__ import annotations

import importlib.abc
import sys
import time
from collections.abc import Callable
from typing import Any


class TorchImportWatcher(importlib.abc.MetaPathFinder):
    """Installs the torch hooks right after the script imports torch, so gpudoctor never imports it first."""

    def __init__(self, on_imported: Callable[[], None], on_timed: Callable[[float], None] | None = None) -> None:
        self._on_imported = on_imported
        self._on_timed = on_timed  # told how long the import took

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            return spec
        original_exec, on_imported, on_timed = spec.loader.exec_module, self._on_imported, self._on_timed

        def exec_module(module: Any) -> None:
            started = time.perf_counter()
            original_exec(module)
            if on_timed is not None:
                on_timed(time.perf_counter() - started)
            on_imported()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec
