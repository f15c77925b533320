"""The always-on watches of what makes a step slow besides the GPU's idle, and of the job's time outside its
steady steps: the optimizers' implementations (collect.optimizer_hooks), the pauses of checkpoints, collections
and evaluations (collect.pauses), the start-up (collect.startup), what torch.compile compiled
(collect.compile_watch), the losses handed to backward() (collect.losses), one step's matrix work
(collect.flops), CUDA's memory when it runs out (collect.gpu_memory); and a try's fix for the step itself
(collect.step_remedies). Installed with the rest of the instrumentation (collect.instrument), each at the moment it
can be.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpudoctor.collect.compile_watch import CompileWatch
from gpudoctor.collect.flops import FlopCount
from gpudoctor.collect.gpu_memory import oom_event
from gpudoctor.collect.losses import LossWatch
from gpudoctor.collect.optimizer_hooks import OptimizerWatch
from gpudoctor.collect.patches import Patches
from gpudoctor.collect.pauses import PauseWatch
from gpudoctor.collect.recorder import ExceptionDetails, Recorder
from gpudoctor.collect.startup import StartupWatch
from gpudoctor.collect.step_remedies import StepRemedies
from gpudoctor.remedy import Remedy


class StepCosts:
    def __init__(self, recorder: Recorder, remedy: Remedy | None, said: Callable[[str], None]) -> None:
        self.recorder = recorder
        self.optimizers = OptimizerWatch(recorder)
        self.pauses = PauseWatch(recorder)
        self.startup = StartupWatch(recorder)
        self.compiles = CompileWatch(recorder)
        self.losses = LossWatch(recorder)
        self.flops = FlopCount(recorder)
        self.remedies = StepRemedies(remedy, said) if remedy is not None else None

    def install(self) -> None:
        """Before the script runs."""
        self.startup.start()
        self.compiles.install()
        self.flops.install()
        self.recorder.on_finishing(self._out_of_memory)
        self.recorder.on_finishing(lambda exception: self.flops.stop())
        if self.remedies is not None:
            self.remedies.install()
            self.startup.on_cuda_init.append(self.remedies.on_cuda_init)

    def on_torch_imported(self, patches: Patches, loader_numbers: Any) -> None:
        self.optimizers.install(patches)
        self.pauses.install(patches)
        self.startup.install(patches, loader_numbers)
        self.losses.install(patches)
        if self.remedies is not None:
            self.remedies.on_torch_imported(patches)

    def on_model(self, model: Any) -> None:
        """The outermost model the loop calls was found."""
        if self.remedies is not None:
            self.remedies.on_model(model)

    def uninstall(self) -> None:
        self.pauses.uninstall()
        self.flops.stop()

    def _out_of_memory(self, exception: ExceptionDetails | None) -> None:
        event = oom_event(exception[0], exception[1]) if exception is not None else None
        if event is not None:
            self.recorder.emit(event)
