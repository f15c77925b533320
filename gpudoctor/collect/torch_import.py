"""Installing the torch hooks right after the script imports torch: gpudoctor never imports it first, so
environment variables the script sets before `import torch` still take effect."""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Callable
from typing import Any


class TorchImportWatcher(importlib.abc.MetaPathFinder):
    """Installs the torch hooks right after the script imports torch, so gpudoctor never imports it first."""

    def __init__(self, on_imported: Callable[[], None]) -> None:
        self._on_imported = on_imported

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            return spec
        original_exec, on_imported = spec.loader.exec_module, self._on_imported

        def exec_module(module: Any) -> None:
            original_exec(module)
            on_imported()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec
