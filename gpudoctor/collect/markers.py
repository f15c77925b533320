"""Named ranges around the phases of a step: NVTX for Nsight Systems users, profiler annotations for the trace."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

DOMAIN = "gpudoctor"


def _nvtx_functions() -> tuple[Callable[[str], Any], Callable[[], Any], str]:
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
