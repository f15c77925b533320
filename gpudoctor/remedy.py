"""A fix that gpudoctor can apply at run time, without editing the script: what `--try-fixes` runs the script with.

A rule attaches one to its finding (`Finding(..., remedy=Remedy(...))`) when its fix is a setting that the
instrumentation can change from outside: a DataLoader's arguments, the intra-op threads, the multiprocessing
start method, non-blocking copies of pinned loader batches. The script's process applies it
(gpudoctor.collect.remedies); findings.json keeps it beside the finding, as `remedy`.
"""

from __future__ import annotations

from typing import Any, cast

import msgspec

# DataLoader arguments a remedy may set, in the order the description gives them.
LOADER_SETTINGS = ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor", "multiprocessing_context")


class LoaderRemedy(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """DataLoader arguments to set (None: left as the script has it), for the loaders built at `at` ("file:line"),
    or every loader when `at` is None. `worker_threads`: each worker's intra-op threads, set after the script's
    own worker_init_fn."""

    at: str | None = None
    num_workers: int | None = None
    pin_memory: bool | None = None
    persistent_workers: bool | None = None
    prefetch_factor: int | None = None
    multiprocessing_context: str | None = None
    worker_threads: int | None = None

    def settings(self) -> dict[str, Any]:
        """The DataLoader keyword arguments this remedy sets."""
        return {name: getattr(self, name) for name in LOADER_SETTINGS if getattr(self, name) is not None}


class Remedy(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """What a try changes. `rank`: only that rank of a job (None: every process that runs the script's code)."""

    loader: LoaderRemedy | None = None
    intra_op_threads: int | None = None
    start_method: str | None = None
    non_blocking_batches: bool = False  # copies of pinned loader batches to the GPU get non_blocking=True
    rank: int | None = None

    def describe(self) -> str:
        """What the try changes, in the script's terms: 'DataLoader(num_workers=6, persistent_workers=True) at
        train.py:74'."""
        parts = []
        if self.loader is not None:
            arguments = [f"{name}={value!r}" for name, value in self.loader.settings().items()]
            if self.loader.worker_threads is not None:
                arguments.append(f"worker_init_fn=... torch.set_num_threads({self.loader.worker_threads})")
            where = f" at {self.loader.at}" if self.loader.at else ""
            parts.append(f"DataLoader({', '.join(arguments)}){where}")
        if self.intra_op_threads is not None:
            parts.append(f"torch.set_num_threads({self.intra_op_threads}) and OMP_NUM_THREADS={self.intra_op_threads}")
        if self.start_method is not None:
            parts.append(f'multiprocessing start method "{self.start_method}"')
        if self.non_blocking_batches:
            parts.append("non_blocking=True on copies of the loader's pinned batches")
        text = "; ".join(parts) or "nothing"
        return text if self.rank is None else f"{text}, on rank {self.rank}"

    def to_json(self) -> dict[str, Any]:
        return cast("dict[str, Any]", msgspec.to_builtins(self))

    @classmethod
    def from_json(cls, data: object) -> Remedy:
        return msgspec.convert(data, cls)
