"""The profiling window: torch.profiler over a bounded run of steps, its trace written the moment it closes."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

from gpudoctor.bundle import PARTIAL_TRACE, RAW_TRACE, trace_name
from gpudoctor.bundle.events import AnyEvent, CollectorEvent, WindowEvent
from gpudoctor.bundle.free_space import short_of_space
from gpudoctor.bundle.trace_file import gzip_file, json_size
from gpudoctor.collect import cupti
from gpudoctor.collect.config import WindowConfig

# The smallest trace torch.profiler writes (its header and deviceProperties alone) is hundreds of bytes.
MIN_TRACE_BYTES = 64
WAITING, WARMUP, ACTIVE, DETAIL, CLOSED, FAILED = "waiting", "warmup", "active", "detail", "closed", "failed"
OFF_MAIN_THREAD = ("the steps end on threads other than the main one, and torch.profiler is only started on the "
                   "main thread: the window timed the steps and watched the calls without recording GPU activity")
CUPTI_STILL_ATTACHED = (f"CUPTI was still attached {cupti.DETACH_DEADLINE_S:g} s after the window closed, so the steps "
                        "after it may have run slower than they do plainly")
LOG = "gpudoctor.log"  # in the run directory: what torch and Kineto printed during gpudoctor's profiler calls
# Kineto's log lines ("USDT:2026-11-23 12:02:54 11726:11726 SyncActivityProfilerHandler.cpp:52] profiler_start",
# "ERROR:... output_json.cpp:...] ...") and c10's ("[W1123 12:02:54.123456 tensor_numpy.cpp:84] ...").
_CHATTER = re.compile(rb"^(?:[A-Z]+:\d{4}-\d\d-\d\d [\d:.]+ \d+:\d+ |\[?[IWEF]\d{4} [\d:.]+ (?:\d+ )?)"
                      rb"\S+\.(?:cpp|cc|cu|h|hpp):\d+\]")


class ProfilerChatter:
    """Keeps what torch and Kineto print during gpudoctor's own profiler calls off the script's terminal.

    Kineto writes with C++ stderr, so fd 2 points at RUN_DIR/gpudoctor.log only for the length of each call;
    a line that another thread of the script wrote meanwhile is not chatter and goes on to the real stderr as the
    call returns. Python warnings that the call raises in this thread (torch's "Failed to initialize NumPy") go to
    the log too; another thread's warnings are shown as usual.
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._fd: int | None = None
        self._depth = 0  # a signal handler that closes the window may run inside a quiet call

    @contextlib.contextmanager
    def quiet(self) -> Iterator[None]:
        if self._depth:
            yield
            return
        self._depth += 1
        redirected = self._redirect_stderr()
        shown = warnings.showwarning
        caught: list[str] = []
        warnings.showwarning = self._warning_catcher(shown, threading.get_ident(), caught)
        try:
            yield
        finally:
            warnings.showwarning = shown
            if redirected is not None:
                self._restore_stderr(*redirected)
            self._log_warnings(caught)
            self._depth -= 1

    def _log_fd(self) -> int:
        if self._fd is None:
            try:
                self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
            except OSError:  # the run directory is gone (removed while the script runs): the chatter goes nowhere
                with tempfile.TemporaryFile() as scratch:  # unlinked already: gone with its last descriptor
                    self._fd = os.dup(scratch.fileno())
        return self._fd

    def _redirect_stderr(self) -> tuple[int, int] | None:
        """Point fd 2 at the log; the saved fd 2 and where this call's part of the log starts, or None if it can't."""
        with contextlib.suppress(Exception):  # the script's own text still buffered goes out first, where it belongs
            sys.stderr.flush()
        try:
            log = self._log_fd()
            start = os.lseek(log, 0, os.SEEK_END)
            saved = os.dup(2)
        except OSError:
            return None  # a stderr left loud loses nothing
        try:
            os.dup2(log, 2)
        except OSError:
            os.close(saved)
            return None
        return saved, start

    def _restore_stderr(self, saved: int, start: int) -> None:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        with contextlib.suppress(OSError):  # nothing here may fail the script's step
            os.dup2(saved, 2)
            os.close(saved)
            self._pass_on(start)

    def _pass_on(self, start: int) -> None:
        """Give the real stderr every line of the log from `start` that is not torch's chatter; keep the rest."""
        log = self._log_fd()
        written = os.pread(log, os.fstat(log).st_size - start, start)
        lines = written.splitlines(keepends=True)
        others = b"".join(line for line in lines if not _CHATTER.match(line))
        if not others:
            return
        _write_all(2, others)
        os.ftruncate(log, start)
        _write_all(log, b"".join(line for line in lines if _CHATTER.match(line)))

    @staticmethod
    def _warning_catcher(shown: Callable[..., None], owner: int, caught: list[str]) -> Callable[..., None]:
        """A warnings.showwarning that keeps the owner thread's warnings in `caught` and shows the others'."""
        def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                 file: TextIO | None = None, line: str | None = None) -> None:
            if threading.get_ident() == owner:
                caught.append(warnings.formatwarning(message, category, filename, lineno, line))
            else:
                shown(message, category, filename, lineno, file, line)

        return show

    def _log_warnings(self, caught: list[str]) -> None:
        """Written once fd 2 is back, so that they are not taken for the script's own lines."""
        with contextlib.suppress(OSError):
            if caught:
                _write_all(self._log_fd(), "".join(caught).encode())


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


def _cuda_in_use() -> bool:
    # Only profile CUDA when the script has initialized it: asking the profiler for CUDA activity in a
    # CPU-only script would create a CUDA context the script never made.
    import torch

    return torch.cuda.is_available() and torch.cuda.is_initialized()


@contextlib.contextmanager
def _inductor_left_unimported() -> Iterator[None]:
    """Within the block, this thread's `hasattr(torch, "_inductor")` is False unless the script imported inductor.

    torch.profiler's start asks `hasattr(torch, "_inductor")` to read inductor's CUDA-graph setting, and torch
    imports that submodule on first access: in a script that never compiled, the profiler's start imported
    inductor and dynamo, with the script standing still (0.74 s of a 0.74 s start on a 2-core CPU,
    bench/profiler_setup.py), and left them loaded in its process. Not imported, inductor has no setting to read.
    Other threads, and import statements, still import it as usual.
    """
    import torch

    lazy = torch.__dict__.get("__getattr__")
    if lazy is None or "torch._inductor" in sys.modules:
        yield
        return
    caller = threading.get_ident()

    def lazy_but_inductor(name: str) -> Any:
        if name == "_inductor" and threading.get_ident() == caller:
            raise AttributeError(f"module 'torch' has no attribute {name!r}")
        return lazy(name)

    setattr(torch, "__getattr__", lazy_but_inductor)  # noqa: B010 - a module's __getattr__, as torch defines it
    try:
        yield
    finally:
        if torch.__dict__.get("__getattr__") is lazy_but_inductor:  # nobody replaced it meanwhile
            setattr(torch, "__getattr__", lazy)  # noqa: B010


class ProfilerWindow:
    """Opens torch.profiler after `wait` steps for `warmup` + `active` steps, exports, then attributes `detail` steps.

    The profiler records GPU activity only (kernels, copies, CUDA runtime calls) and is started and stopped
    once, with no per-step call: measured on an H100 (bench/profiler_cost.py), CPU operators cost a launch-heavy
    step another 30-50% and a profiler.step() at every step up to 13%. CUPTI itself still costs such a step 1.3x to
    2x while attached, so Kineto is asked to detach it when the window stops. The steps' own clock places them on
    the trace. A script that does not use CUDA gets CPU operators instead, and so does --with-stack, which asks
    for them. After the profiled steps, `detail` steps run with gpudoctor's per-call hooks (`attributing`), and
    no profiler.

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
        self.cpu_ops = False  # the profiler open now records CPU operators (and so gpudoctor's annotations)
        self.index = -1  # the window open now, or the last one opened
        self._first_step = config.wait  # the first step of the window open now (or of the first one)
        self._opens_at = config.wait  # the step at which the first window opens
        self._stale_traces = 0  # traces of windows 0 to this one (excluded) from before a restart, for the next open
        self._opened_at = 0.0  # time.monotonic() when the last window opened
        self._chatter = ProfilerChatter(run_dir / LOG)
        self._detach = cupti.Detach()

    def state_for_step(self, step: int) -> str:
        """Which phase of the window step number `step` (0-based) falls in."""
        if self.state == FAILED:
            return FAILED
        if step < self._first_step:
            return WAITING if self.index < 0 else CLOSED
        into = step - self._first_step
        if into < self.config.warmup:
            return WARMUP
        if into < self.config.warmup + self.config.active:
            return ACTIVE
        return DETAIL if into < self.config.length else CLOSED

    def on_step_completed(self, completed: int) -> None:
        if self.state == WAITING and completed >= self._opens_at:
            self._open(completed)
            return
        into = completed - self._first_step
        if self.state == WARMUP and into >= self.config.warmup:
            self.state = ACTIVE
        if self.state == ACTIVE and into >= self.config.warmup + self.config.active:
            self._stop_and_export()
            if self.state == FAILED:
                return
            self.state = DETAIL
        if self.state == DETAIL and into >= self.config.length:
            self.state = CLOSED
        if self._due():
            self._open(completed)

    def _due(self) -> bool:
        """Whether a repeated window should open now."""
        return (self.config.every_s is not None and self.state == CLOSED and self.index >= 0
                and time.monotonic() - self._opened_at >= self.config.every_s)

    def restart(self, completed: int) -> None:
        """Open again `wait` steps from now: the steps counted so far were not the program's own.

        The recorder calls this when a stronger step source takes over after a weaker one counted steps: an
        evaluation before training (nanoGPT's estimate_loss, a sanity check) counted by the model's forward calls,
        then the training loop's optimizer. A window open now is closed and written as usual, so that a run whose
        new steps never reach the window still has it; the next window to open deletes it and every trace
        before it, and the analysis (`restarted`) reads the steps from that window's source on.
        """
        if self.state == FAILED:
            return
        if self.state == WAITING and self.index < 0 and self._opens_at == completed + self.config.wait:
            return  # nothing counted since the last restart
        if self._profiler is not None:
            if threading.current_thread() is not threading.main_thread():
                return  # Kineto is stopped on the thread that started it: this window stays as it is
            self._stop_and_export()
            if self.state == FAILED:
                return
        self._stale_traces = max(self._stale_traces, self.index + 1)
        self.index = -1
        self.state = WAITING
        self._opens_at = self._first_step = completed + self.config.wait
        self._emit(WindowEvent(state="restarted", first_step=self._opens_at))

    def close(self, final: bool = False) -> None:
        """Stop early (script ended, --max-steps, Ctrl-C): an active window still writes what it recorded.

        `final`: the process is ending, so CUPTI is left attached (cupti.py says why), and an earlier window's
        detaching is seen through first."""
        if self.state in (WAITING, WARMUP, ACTIVE):
            self._emit(WindowEvent(state="ended_early", from_state=self.state, index=max(0, self.index)))
        if final:
            self._finish_detaching()
        if self._profiler is not None:
            self._stop_and_export(final)
        if self.state != FAILED:
            self.state = CLOSED

    @property
    def recording(self) -> bool:
        """The profiler records: the warm-up and active steps."""
        return self.state in (WARMUP, ACTIVE)

    @property
    def attributing(self) -> bool:
        """gpudoctor's per-call hooks should be on: the detail steps."""
        return self.state == DETAIL

    def _open(self, completed: int) -> None:
        if threading.current_thread() is threading.main_thread():
            try:
                with self._chatter.quiet():  # gpudoctor's own import of torch warns when NumPy is missing, for one
                    self.cuda = _cuda_in_use()
                    self._profiler = self._start_profiler()
            except Exception as exc:  # noqa: BLE001 - without a profiler the script still runs; the manifest says why
                self._profiler = None
                self._fail(f"torch.profiler could not start: {exc.__class__.__name__}: {exc}")
                return
        else:  # Kineto started from a thread other than the one that registered it can crash the process
            self._emit(CollectorEvent(name="profiler", ok=False, reason=OFF_MAIN_THREAD))
        for index in range(self._stale_traces):
            (self._run_dir / trace_name(index)).unlink(missing_ok=True)
        self._stale_traces = 0
        self.index += 1
        self._first_step = completed
        self._opened_at = time.monotonic()
        self.state = WARMUP if self.config.warmup else ACTIVE
        self._emit(WindowEvent(state="opened", index=self.index, first_step=completed, cuda=self.cuda,
                               trace=trace_name(self.index)))

    def _start_profiler(self) -> Any:
        from torch.profiler import ProfilerActivity, profile

        self.cpu_ops = self._with_stack or not self.cuda
        if self.cuda:
            cupti.request_teardown()
        activities = ([ProfilerActivity.CPU] if self.cpu_ops else []) + ([ProfilerActivity.CUDA] if self.cuda else [])
        profiler = profile(activities=activities, record_shapes=self._with_stack, with_stack=self._with_stack)
        with _inductor_left_unimported():
            profiler.start()
        return profiler

    def _stop_and_export(self, final: bool = False) -> None:
        profiler, self._profiler = self._profiler, None
        if profiler is None:
            return
        try:
            try:
                with self._chatter.quiet(), self._detaching(final):
                    profiler.stop()
            except Exception as exc:  # noqa: BLE001 - the trace is lost, the run is not
                self._fail(f"torch.profiler failed while stopping: {exc}")
                return
            self._export(profiler)
        finally:
            if not final:  # after the export, which gave Kineto's detaching thread time to arm its callback
                self._finish_detaching()

    def _detaching(self, final: bool) -> contextlib.AbstractContextManager[None]:
        """Around the profiler's stop: no CUPTI teardown for the process's last window, else the teardown watched."""
        if not self.cuda:
            return contextlib.nullcontext()
        return cupti.no_teardown() if final else self._detach.watching()

    def _finish_detaching(self) -> None:
        if self._detach.pending and not self._detach.complete():
            self._emit(CollectorEvent(name="cupti_detach", ok=False, reason=CUPTI_STILL_ATTACHED))

    def _export(self, profiler: Any) -> None:
        started = time.perf_counter()
        final = self._run_dir / trace_name(self.index)
        raw, partial = self._run_dir / RAW_TRACE, self._run_dir / PARTIAL_TRACE
        try:
            # The trace takes the disk's free space only while that leaves the script its margin: before the
            # export, and before its compressed copy is written beside it.
            _raise_if_short(self._run_dir)
            # Exported as plain JSON and compressed here: torch's own .gz export writes line by line at level 9.
            with self._chatter.quiet():
                profiler.export_chrome_trace(str(raw))
            if json_size(raw) < MIN_TRACE_BYTES:  # torch logs a failed write (a full disk) and goes on
                raise OSError("the profiler wrote an empty trace: the run directory may be full")
            _raise_if_short(self._run_dir)
            gzip_file(raw, partial)
            os.replace(partial, final)
        except Exception as exc:  # noqa: BLE001 - the window's trace is lost, the script runs on
            partial.unlink(missing_ok=True)
            self._fail(f"the profiler trace could not be written: {exc.__class__.__name__}: {exc}")
            return
        finally:
            raw.unlink(missing_ok=True)
        self.state = CLOSED
        self._emit(WindowEvent(state="closed", index=self.index, first_step=self._first_step,
                               export_s=time.perf_counter() - started, trace_bytes=final.stat().st_size,
                               trace=final.name))

    def _fail(self, reason: str) -> None:
        self.state = FAILED
        self._emit(CollectorEvent(name="profiler", ok=False, reason=reason))


def _raise_if_short(run_dir: Path) -> None:
    short = short_of_space(run_dir)
    if short is not None:
        raise short
