"""Named ranges around the phases of a step: NVTX for Nsight Systems users, profiler annotations for the trace."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

DOMAIN = "gpudoctor"
# What an NVTX tool (Nsight Systems, Nsight Compute) sets in the environment of the process it watches; without
# one, NVTX ranges go nowhere.
INJECTION_VARIABLES = ("NVTX_INJECTION64_PATH", "NVTX_INJECTION32_PATH")
NO_TOOL = "no NVTX tool (Nsight Systems) watches the run, so no ranges are pushed"


def nvtx_tool_attached(environ: Mapping[str, str] = os.environ) -> bool:
    return any(environ.get(name) for name in INJECTION_VARIABLES)


def _nvtx_functions() -> tuple[Callable[[str], Any], Callable[[], Any], str]:
    if not nvtx_tool_attached():
        # The nvtx package imports NumPy (0.43 s before the script's first line on an H100 machine, and a BLAS
        # thread pool the script may never have started): not worth it for ranges nobody reads.
        return (lambda name: None), (lambda: None), NO_TOOL
    try:
        import nvtx

        return (lambda name: nvtx.push_range(name, domain=DOMAIN)), (lambda: nvtx.pop_range(domain=DOMAIN)), "ok"
    except Exception as exc:  # noqa: BLE001 - nvtx is optional at run time: no ranges then, and the manifest says why
        reason = f"the nvtx package could not be imported ({exc.__class__.__name__}: {exc})"
        return (lambda name: None), (lambda: None), reason


class Markers:
    """Push/pop one phase range at a time per call site; annotate the profiler trace only while it records."""

    def __init__(self) -> None:
        self._push, self._pop, self.nvtx_status = _nvtx_functions()
        self.annotate = False  # set while the profiler records CPU operators (and so these annotations)

    def begin(self, phase: str) -> Any:
        self._push(phase)
        if not self.annotate:
            return None
        import torch

        return torch.ops.profiler._record_function_enter_new(f"{DOMAIN}/{phase}", None)

    def end(self, handle: Any) -> None:
        self._pop()
        if handle is not None:
            import torch

            torch.ops.profiler._record_function_exit._RecordFunction(handle)
