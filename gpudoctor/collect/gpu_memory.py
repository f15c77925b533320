"""The CUDA caching allocator's state, read at the window's step boundaries and when CUDA runs out of memory.

`torch.cuda.memory_stats()` is one call into the allocator (a dictionary of its counters): taken only at the end of
the window's steps, where the recorder reads the allocated and reserved bytes already, it costs no step outside the
window anything. gpudoctor never initializes CUDA for it: a process that has not is not asked.
"""

from __future__ import annotations

import re
import sys
from typing import Any

from gpudoctor.bundle.events import CudaMemory, OomEvent

# The allocation that failed, as torch's OutOfMemoryError says it: "Tried to allocate 2.00 GiB."
_REQUESTED = re.compile(r"[Tt]ried to allocate ([0-9.]+ [KMGT]?i?B)")
OOM_ERRORS = ("OutOfMemoryError",)  # torch.OutOfMemoryError, torch.cuda.OutOfMemoryError


def cuda_memory() -> CudaMemory | None:
    """The allocator's bytes and counters now, or None where CUDA was never initialized."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    stats = _stats(torch)
    return CudaMemory(
        allocated=torch.cuda.memory_allocated(), reserved=torch.cuda.memory_reserved(),
        max_allocated=torch.cuda.max_memory_allocated(), max_reserved=_count(stats, "reserved_bytes.all.peak"),
        alloc_retries=_count(stats, "num_alloc_retries"), ooms=_count(stats, "num_ooms"),
        device_allocs=_count(stats, "num_device_alloc"), device_frees=_count(stats, "num_device_free"),
        inactive_split=_count(stats, "inactive_split_bytes.all.current"),
    )


def oom_event(exception: str | None, message: str | None) -> OomEvent | None:
    """Where the device's memory was when the script ended with CUDA's out-of-memory error; None for any other
    ending."""
    if exception is None or not exception.endswith(OOM_ERRORS):
        return None
    torch = sys.modules.get("torch")
    free = total = None
    if torch is not None and torch.cuda.is_initialized():
        try:
            free, total = torch.cuda.mem_get_info()
        except Exception:  # noqa: BLE001 - a device in an error state: what the allocator knows is still written
            free = total = None
    found = _REQUESTED.search(message or "")
    return OomEvent(memory=cuda_memory(), free=free, total=total, requested=found.group(1) if found else None)


def _stats(torch: Any) -> dict[str, Any]:
    try:
        return dict(torch.cuda.memory_stats())
    except Exception:  # noqa: BLE001 - an allocator that cannot say (a backend of its own): its counters are left out
        return {}


def _count(stats: dict[str, Any], key: str) -> int | None:
    value = stats.get(key)
    return value if type(value) is int and value >= 0 else None
