"""The loss the script hands to backward(), step by step: what a try that changes the numerics is compared by.

Reading a CUDA loss's value would make the host wait for the GPU at every step, so each is kept as it is (detached:
no graph held), a few hundred at a time stacked into one tensor on its device, and all are read once, as the
process finishes: one wait, after the script's last step. Only a scalar handed to backward() is a loss; at most
MAX_LOSSES are kept, and none while a CUDA graph is being captured (its replays rewrite the loss in place).
"""

from __future__ import annotations

import functools
import math
from typing import Any

from gpudoctor.bundle.events import LossEvent
from gpudoctor.collect.compile_safe import compiling_check, plain_tensor_types, quietly
from gpudoctor.collect.patches import Patches
from gpudoctor.collect.recorder import ExceptionDetails, Recorder

MAX_LOSSES = 20_000
STACK_EVERY = 256  # losses kept as tensors of their own before they are stacked into one


class LossWatch:
    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.steps: list[int] = []
        self._loose: list[Any] = []  # detached scalars, not stacked yet
        self._stacked: list[Any] = []  # tensors of STACK_EVERY losses each

    def install(self, patches: Patches) -> None:
        import torch.autograd

        compiling, plain = compiling_check(), plain_tensor_types()
        keep = self._keep

        def make(original: Any) -> Any:
            @functools.wraps(original)
            def backward(*args: Any, **kwargs: Any) -> Any:
                tensors = args[0] if args else kwargs.get("tensors")
                if type(tensors) in plain and not compiling():
                    quietly(keep, tensors)
                return original(*args, **kwargs)

            return backward

        patches.wrap(torch.autograd, "backward", make)
        self.recorder.on_finishing(self._write)

    def _keep(self, loss: Any) -> None:
        if len(self.steps) >= MAX_LOSSES or loss.numel() != 1 or not loss.is_floating_point():
            return
        if loss.is_cuda and _capturing():  # a CUDA graph being captured: nothing of gpudoctor's may enter it
            return
        self.steps.append(self.recorder.completed)
        self._loose.append(loss.detach().reshape(()))
        if len(self._loose) >= STACK_EVERY:
            self._stack()

    def _stack(self) -> None:
        import torch

        loose, self._loose = self._loose, []
        try:
            self._stacked.append(torch.stack(loose))
        except RuntimeError:  # losses on several devices, or of several dtypes: each kept as it is
            self._stacked.extend(loss.reshape(1) for loss in loose)

    def _write(self, exception: ExceptionDetails | None) -> None:
        if not self.steps:
            return
        if self._loose:
            self._stack()
        values = [v if math.isfinite(v) else None for chunk in self._stacked for v in chunk.float().cpu().tolist()]
        self.recorder.emit(LossEvent(steps=self.steps[:len(values)], values=values))


def _capturing() -> bool:
    import torch

    return bool(torch.cuda.is_current_stream_capturing())
