"""Instrumentation installed in the script's process before the script runs.

Always on, because each costs one Python call per step or less: step detection (optimizer hooks,
DataLoader batches: collect.loader_hooks), data-wait timing, loader settings, thread starts, processes, forks and
the process group joined (collect.process_hooks). Only in the window's detail steps, after the profiled ones
(collect.window_hooks): phase timing (forward, backward), host<->device copy and synchronization call sites, and
the GIL probe, since those wrap calls that a step makes many times and would slow the steps whose times the
figures come from.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from gpudoctor.bundle.events import TorchEvent
from gpudoctor.collect import process_hooks, window_hooks
from gpudoctor.collect.compile_safe import quietly
from gpudoctor.collect.gilprobe import GilProbe
from gpudoctor.collect.hostlines import HostLines
from gpudoctor.collect.loader_hooks import LoaderHooks
from gpudoctor.collect.patches import Patches
from gpudoctor.collect.recorder import Recorder
from gpudoctor.collect.remedies import Remedies, for_this_process
from gpudoctor.collect.step_costs import StepCosts
from gpudoctor.collect.step_hooks import KeptHooks, find_outermost_model, hook_backward_steps
from gpudoctor.collect.torch_import import TorchImportWatcher
from gpudoctor.remedy import Remedy

perf_counter = time.perf_counter


def _unsaid(change: str) -> None:
    """No try, no change to say."""


class Instrumentation:
    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self._always = Patches()
        self._in_window = Patches()
        self._window_hooks: list[Any] = []
        self._step_hooks: list[Any] = []  # module hooks that find steps (removed at the end)
        self._optimizer_hooks: list[Any] = []  # the global optimizer hooks (removed at the end)
        self._kept_hooks = KeptHooks()  # those hooks, kept when the model they found is compiled
        self._local = threading.local()  # per-thread: the optimizer step's start, re-entrancy guard
        self._host_lines = HostLines(recorder.config.gil_probe_interval_s)
        self._probe = GilProbe(recorder.config.gil_probe_interval_s, recorder.add_gil_delay, self._host_lines.sample)
        remedy = for_this_process(Remedy.from_json(recorder.config.remedy) if recorder.config.remedy else None)
        self.remedies = Remedies(remedy, recorder.emit) if remedy is not None else None
        self.loaders = LoaderHooks(self.remedies)
        self.costs = StepCosts(recorder, remedy, self.remedies.said if self.remedies is not None else _unsaid)
        recorder.on_window_change(self._on_window_change)

    # -- installation ----------------------------------------------------------------------------
    def install(self) -> None:
        if self.remedies is not None:
            self.remedies.install(self._always)
        self._patch_threads()
        self._patch_processes()
        process_hooks.watch_forks(self.recorder)
        self.costs.install()
        if "torch" in sys.modules:
            self.on_torch_imported()
        else:
            sys.meta_path.insert(0, TorchImportWatcher(self.on_torch_imported, self.costs.startup.torch_imported))

    def on_torch_imported(self) -> None:
        import torch

        if self.remedies is not None:
            self.remedies.on_torch_imported(self._always)
        self.loaders.install(self._always, self.recorder)
        self._hook_optimizers()
        process_hooks.patch_process_group(self._always, self.recorder)
        hook_backward_steps(self.recorder, self._always)
        self.costs.on_torch_imported(self._always, self.loaders.numbers)
        find_outermost_model(self.recorder, self._step_hooks, self._kept_hooks, self.costs.on_model)
        self.recorder.emit(TorchEvent(version=torch.__version__, cuda_build=torch.version.cuda,
                                      cuda_built=torch.backends.cuda.is_built()))

    def uninstall(self) -> None:
        self._on_window_change(False)
        self._remove_hooks()

    def abandon(self) -> None:
        """Take everything off without writing (a forked child that records on its own from here): its threads
        did not survive the fork, and the window's hooks go with the rest."""
        for handle in self._window_hooks:
            handle.remove()
        self._window_hooks.clear()
        self._in_window.restore()
        self._remove_hooks()

    def _remove_hooks(self) -> None:
        self.costs.uninstall()
        for handle in [*self._step_hooks, *self._optimizer_hooks]:
            handle.remove()
        self._step_hooks.clear()
        self._optimizer_hooks.clear()
        self._always.restore()

    # -- always on -------------------------------------------------------------------------------
    def _patch_threads(self) -> None:
        process_hooks.patch_threads(self._always, self.recorder)

    def _patch_processes(self) -> None:
        process_hooks.patch_processes(self._always, self.recorder)

    def _hook_optimizers(self) -> None:
        from torch.optim import optimizer

        recorder, markers, local, optimizers = self.recorder, self.recorder.markers, self._local, self.costs.optimizers

        def pre(opt: Any, args: Any, kwargs: Any) -> None:
            local.optimizer = (markers.begin("optimizer"), perf_counter(), recorder.timed_inside())

        def post(opt: Any, args: Any, kwargs: Any) -> None:
            handle, started, before = getattr(local, "optimizer", (None, perf_counter(), recorder.timed_inside()))
            markers.end(handle)
            # A closure run inside step() (Lightning's, LBFGS's) is timed as forward and backward: not again here.
            inside = max(0.0, recorder.timed_inside() - before)
            quietly(optimizers.stepped, opt)
            recorder.on_optimizer_step(opt, max(0.0, perf_counter() - started - inside))

        self._optimizer_hooks += [optimizer.register_optimizer_step_pre_hook(pre),
                                  optimizer.register_optimizer_step_post_hook(post)]

    # -- only in the window's detail steps -------------------------------------------------------
    def _on_window_change(self, hooked: bool) -> None:
        if hooked and not self._window_hooks:
            self._install_window_hooks()
            self._probe.start()
            self.recorder.emit(window_hooks.torch_runtime_facts())
        elif not hooked and self._window_hooks:
            self._probe.stop()
            lines = self._host_lines.event()
            if lines is not None:
                self.recorder.emit(lines)
            for handle in self._window_hooks:
                handle.remove()
            self._window_hooks.clear()
            self._in_window.restore()

    def _install_window_hooks(self) -> None:
        import torch

        self._window_hooks.extend(window_hooks.forward_hooks(self.recorder, self._kept_hooks))
        window_hooks.patch_backward(self._in_window, self.recorder)
        window_hooks.patch_copies(self._in_window, self.recorder, self._local, torch)
        window_hooks.patch_syncs(self._in_window, self.recorder, self._local, torch)
