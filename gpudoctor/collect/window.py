"""The profiling window: torch.profiler over a bounded run of steps, its trace written the moment it closes."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpudoctor.bundle import TRACE
from gpudoctor.collect.config import WindowConfig

WAITING, WARMUP, ACTIVE, CLOSED, FAILED = "waiting", "warmup", "active", "closed", "failed"


def _cuda_in_use() -> bool:
    # Only profile CUDA when the script has initialized it: asking the profiler for CUDA activity in a
    # CPU-only script would create a CUDA context the script never made.
    import torch

    return torch.cuda.is_available() and torch.cuda.is_initialized()


class ProfilerWindow:
    """Opens torch.profiler after `wait` steps, records `warmup` + `active`, exports, and lets go of it."""

    def __init__(self, config: WindowConfig, run_dir: Path, emit: Callable[[dict[str, Any]], None],
                 with_stack: bool = False) -> None:
        self.config = config
        self._with_stack = with_stack
        self._run_dir = run_dir
        self._emit = emit
        self._profiler: Any = None
        self.state = WAITING
        self.cuda = False

    def state_for_step(self, step: int) -> str:
        """Which phase of the window step number `step` (0-based) falls in."""
        if self.state == FAILED:
            return FAILED
        if step < self.config.wait:
            return WAITING
        if step < self.config.first_active:
            return WARMUP
        return ACTIVE if step < self.config.end else CLOSED

    def on_step_completed(self, completed: int) -> None:
        if self.state == WAITING and completed >= self.config.wait:
            self._open()
        elif self._profiler is not None:
            if self.state == CLOSED:
                self._release()
            else:
                self._profiler.step()
                if completed >= self.config.first_active and self.state == WARMUP:
                    self.state = ACTIVE

    def close(self) -> None:
        """Stop early (script ended, --max-steps, Ctrl-C): an active window still writes what it recorded."""
        if self.state in (WAITING, WARMUP, ACTIVE):
            self._emit({"kind": "window", "state": "ended_early", "from_state": self.state})
        if self._profiler is not None:
            try:
                self._profiler.stop()
            except Exception as exc:  # the trace is lost, the run is not
                self._fail(f"torch.profiler failed while stopping: {exc}")
            self._profiler = None
        if self.state != FAILED:
            self.state = CLOSED

    @property
    def recording(self) -> bool:
        return self.state in (WARMUP, ACTIVE)

    def _open(self) -> None:
        from torch.profiler import ProfilerActivity, profile, schedule

        self.cuda = _cuda_in_use()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        try:
            self._profiler = profile(
                activities=activities,
                schedule=schedule(wait=0, warmup=self.config.warmup, active=self.config.active, repeat=1),
                on_trace_ready=self._export,
                record_shapes=True,
                with_stack=self._with_stack,
            )
            self._profiler.start()
        except Exception as exc:
            self._profiler = None
            self._fail(f"torch.profiler could not start: {exc.__class__.__name__}: {exc}")
            return
        self.state = WARMUP if self.config.warmup else ACTIVE
        self._emit({"kind": "window", "state": "opened", "first_step": self.config.wait, "cuda": self.cuda})

    def _export(self, profiler: Any) -> None:
        started = time.perf_counter()
        final = self._run_dir / TRACE
        partial = self._run_dir / "trace.partial.json.gz"  # torch gzips when the name ends in .gz
        try:
            profiler.export_chrome_trace(str(partial))
            os.replace(partial, final)
        except Exception as exc:
            self._fail(f"the profiler trace could not be written: {exc.__class__.__name__}: {exc}")
            return
        self.state = CLOSED
        self._emit({
            "kind": "window", "state": "closed", "first_step": self.config.wait,
            "export_s": time.perf_counter() - started, "trace_bytes": final.stat().st_size,
        })

    def _release(self) -> None:
        try:
            self._profiler.stop()
        except Exception:  # the trace is already on disk; a failure to tear down changes nothing
            pass
        self._profiler = None

    def _fail(self, reason: str) -> None:
        self.state = FAILED
        self._emit({"kind": "collector", "name": "profiler", "ok": False, "reason": reason})
