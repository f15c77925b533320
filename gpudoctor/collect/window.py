"""The profiling window: torch.profiler over a bounded run of steps, its trace written the moment it closes."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpudoctor.bundle import PARTIAL_TRACE, trace_name
from gpudoctor.bundle.events import AnyEvent, CollectorEvent, WindowEvent
from gpudoctor.bundle.trace_stream import json_size
from gpudoctor.collect.config import WindowConfig

# The smallest trace torch.profiler writes (its header and deviceProperties alone) is hundreds of bytes.
MIN_TRACE_BYTES = 64
WAITING, WARMUP, ACTIVE, CLOSED, FAILED = "waiting", "warmup", "active", "closed", "failed"


def _cuda_in_use() -> bool:
    # Only profile CUDA when the script has initialized it: asking the profiler for CUDA activity in a
    # CPU-only script would create a CUDA context the script never made.
    import torch

    return torch.cuda.is_available() and torch.cuda.is_initialized()


class ProfilerWindow:
    """Opens torch.profiler after `wait` steps, records `warmup` + `active`, exports, and lets go of it.

    With `config.every_s` it opens again, a fresh profiler each time, at the first step boundary that
    many seconds after the previous window opened; window N writes `trace_name(N)`.
    """

    def __init__(self, config: WindowConfig, run_dir: Path, emit: Callable[[AnyEvent], None],
                 with_stack: bool = False) -> None:
        self.config = config
        self._with_stack = with_stack
        self._run_dir = run_dir
        self._emit = emit
        self._profiler: Any = None
        self.state = WAITING
        self.cuda = False
        self.index = -1  # the window open now, or the last one opened
        self._first_step = config.wait  # the first step of the window open now (or of the first one)
        self._opened_at = 0.0  # time.monotonic() when the last window opened

    def state_for_step(self, step: int) -> str:
        """Which phase of the window step number `step` (0-based) falls in."""
        if self.state == FAILED:
            return FAILED
        if step < self._first_step:
            return WAITING if self.index < 0 else CLOSED
        if step < self._first_step + self.config.warmup:
            return WARMUP
        return ACTIVE if step < self._first_step + self.config.warmup + self.config.active else CLOSED

    def on_step_completed(self, completed: int) -> None:
        if self.state == WAITING and completed >= self.config.wait:
            self._open(completed)
        elif self._profiler is not None:
            if self.state == CLOSED:
                self._release()
                if self._due():
                    self._open(completed)
            else:
                self._profiler.step()
                if completed >= self._first_step + self.config.warmup and self.state == WARMUP:
                    self.state = ACTIVE
        elif self._due():
            self._open(completed)

    def _due(self) -> bool:
        """Whether a repeated window should open now."""
        return (self.config.every_s is not None and self.state == CLOSED and self.index >= 0
                and time.monotonic() - self._opened_at >= self.config.every_s)

    def close(self) -> None:
        """Stop early (script ended, --max-steps, Ctrl-C): an active window still writes what it recorded."""
        if self.state in (WAITING, WARMUP, ACTIVE):
            self._emit(WindowEvent(state="ended_early", from_state=self.state, index=max(0, self.index)))
        if self._profiler is not None:
            try:
                self._profiler.stop()
            except Exception as exc:  # noqa: BLE001 - the trace is lost, the run is not
                self._fail(f"torch.profiler failed while stopping: {exc}")
            self._profiler = None
        if self.state != FAILED:
            self.state = CLOSED

    @property
    def recording(self) -> bool:
        return self.state in (WARMUP, ACTIVE)

    def _open(self, completed: int) -> None:
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
        except Exception as exc:  # noqa: BLE001 - without a profiler the script still runs, and the manifest says why
            self._profiler = None
            self._fail(f"torch.profiler could not start: {exc.__class__.__name__}: {exc}")
            return
        self.index += 1
        self._first_step = completed
        self._opened_at = time.monotonic()
        self.state = WARMUP if self.config.warmup else ACTIVE
        self._emit(WindowEvent(state="opened", index=self.index, first_step=completed, cuda=self.cuda,
                               trace=trace_name(self.index)))

    def _export(self, profiler: Any) -> None:
        started = time.perf_counter()
        final = self._run_dir / trace_name(self.index)
        partial = self._run_dir / PARTIAL_TRACE  # torch gzips when the name ends in .gz
        try:
            profiler.export_chrome_trace(str(partial))
            if json_size(partial) < MIN_TRACE_BYTES:  # torch logs a failed write (a full disk) and goes on
                partial.unlink()
                raise OSError("the profiler wrote an empty trace: the run directory may be full")
            os.replace(partial, final)
        except Exception as exc:  # noqa: BLE001 - the window's trace is lost, the script runs on
            self._fail(f"the profiler trace could not be written: {exc.__class__.__name__}: {exc}")
            return
        self.state = CLOSED
        self._emit(WindowEvent(state="closed", index=self.index, first_step=self._first_step,
                               export_s=time.perf_counter() - started, trace_bytes=final.stat().st_size,
                               trace=final.name))

    def _release(self) -> None:
        with contextlib.suppress(Exception):  # the trace is already on disk; a failure to tear down changes nothing
            self._profiler.stop()
        self._profiler = None

    def _fail(self, reason: str) -> None:
        self.state = FAILED
        self._emit(CollectorEvent(name="profiler", ok=False, reason=reason))
