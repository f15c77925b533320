"""A try's fix for the step itself, applied in the script's process (gpudoctor.remedy): the script runs unchanged.

- The optimizer's implementation: `fused=True` (or `foreach=True` where torch has no fused kernel for the optimizer
  or the parameters' device) set in the __init__ of torch.optim's optimizers built at the remedy's line.
- The CUDA allocator's settings: PYTORCH_CUDA_ALLOC_CONF, before the script runs (CUDA reads it when it starts).
- TF32 matmuls: torch.set_float32_matmul_precision at torch's import, kept when the script sets its own.
- bf16 autocast: around each call of the outermost model, once it is found (collect.step_hooks).
- torch.compile: the outermost model's calls run through torch.compile, once it is found.

Each change is said (RemedyEvent) as it is first made, as collect.remedies does for the loader's.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import sys
import weakref
from collections.abc import Callable
from typing import Any

from gpudoctor.collect.callsite import location, user_frame_from
from gpudoctor.collect.patches import Patches
from gpudoctor.remedy import Remedy

ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"


class StepRemedies:
    def __init__(self, remedy: Remedy, said: Callable[[str], None]) -> None:
        self.remedy, self.said = remedy, said
        self._patches: Patches | None = None  # where the class of the model gets its autocast

    # -- before the script runs ---------------------------------------------------------------------------
    def install(self) -> None:
        conf = self.remedy.alloc_conf
        if conf is not None:
            current = os.environ.get(ALLOC_CONF)
            os.environ[ALLOC_CONF] = f"{current},{conf}" if current else conf

    def on_cuda_init(self) -> None:
        if self.remedy.alloc_conf is not None:
            self.said(f"{ALLOC_CONF}={os.environ.get(ALLOC_CONF, self.remedy.alloc_conf)}")

    # -- once torch is imported ---------------------------------------------------------------------------
    def on_torch_imported(self, patches: Patches) -> None:
        import torch

        self._patches = patches
        precision = self.remedy.matmul_precision
        if precision is not None:
            torch.set_float32_matmul_precision(precision)
            self.said(f'torch.set_float32_matmul_precision("{precision}")')
            patches.wrap(torch, "set_float32_matmul_precision", self._keep_precision(precision))
        if self.remedy.optimizer is not None:
            for cls in _optimizer_classes(torch):
                patches.wrap(cls, "__init__", self._implementation(cls))

    def _keep_precision(self, precision: str) -> Callable[[Any], Any]:
        said = self.said

        def make(original: Any) -> Any:
            def set_float32_matmul_precision(asked: str) -> None:
                if asked != precision:
                    said(f'torch.set_float32_matmul_precision("{precision}") where the script sets "{asked}"')
                original(precision)

            return set_float32_matmul_precision

        return make

    def _implementation(self, cls: type) -> Callable[[Any], Any]:
        """cls.__init__ that builds the optimizer at the remedy's line with its fused (or foreach) implementation."""
        wanted = self.remedy.optimizer
        assert wanted is not None
        said = self.said

        def make(original: Any) -> Any:
            def __init__(opt: Any, *args: Any, **kwargs: Any) -> None:
                if type(opt) is cls:
                    args, kwargs = _with_implementation(original, opt, args, kwargs, wanted.implementation,
                                                        wanted.at, said)
                original(opt, *args, **kwargs)

            return __init__

        return make

    # -- once the outermost model is found ----------------------------------------------------------------
    def on_model(self, model: Any) -> None:
        """The model the loop calls: run under autocast, or through torch.compile, as the remedy says."""
        if self.remedy.compile is not None and _compilable(model):
            self._compile(model, self.remedy.compile)
        if self.remedy.autocast is not None:
            self._autocast(model, self.remedy.autocast)

    def _compile(self, model: Any, backend: str) -> None:
        """Calls of `model` through torch.compile, as `model = torch.compile(model)` would make them: through its
        class's __call__, nothing added to the model. Not `model.compile()`: compiled in place, the module's own
        call is a frame of its own, whose global module hooks (gpudoctor's among them) break the graph at each
        submodule (a 24-block model ran 1.6x faster so, 3.6x as the script compiles it)."""
        import torch

        from gpudoctor.collect.step_hooks import COMPILED_BY_A_TRY

        if self._patches is None:
            return

        def make(original: Any) -> Any:
            def call_model(*args: Any, **kwargs: Any) -> Any:
                return original(model, *args, **kwargs)

            compiled = torch.compile(call_model, backend=backend)

            def __call__(module: Any, *args: Any, **kwargs: Any) -> Any:
                if module is not model:
                    return original(module, *args, **kwargs)
                return compiled(*args, **kwargs)

            return __call__

        self._patches.wrap(type(model), "__call__", make)
        COMPILED_BY_A_TRY.append(weakref.ref(model))
        self.said(f'torch.compile({type(model).__name__}, backend="{backend}") on the model the loop calls')

    def _autocast(self, model: Any, dtype_name: str) -> None:
        """Calls of `model` under torch.autocast, through its class's __call__ (as collect.step_hooks watches it):
        nothing is added to the model, which the script may pickle."""
        import torch

        dtype, device = getattr(torch, dtype_name), _device_type(model)
        watched = weakref.ref(model)

        def make(original: Any) -> Any:
            def __call__(module: Any, *args: Any, **kwargs: Any) -> Any:
                if module is not watched():
                    return original(module, *args, **kwargs)
                with torch.autocast(device, dtype=dtype):
                    return original(module, *args, **kwargs)

            return __call__

        if self._patches is None:
            return
        self._patches.wrap(type(model), "__call__", make)
        self.said(f"torch.autocast({device!r}, dtype=torch.{dtype_name}) around each call of {type(model).__name__}")


def _with_implementation(init: Any, opt: Any, args: tuple[Any, ...], kwargs: dict[str, Any], implementation: str,
                         at: str | None, said: Callable[[str], None]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments of an optimizer's __init__ with `implementation` (fused, or foreach) set, for one built at `at`."""
    site = location(user_frame_from(sys._getframe(2)))
    where = f"{site.file}:{site.line}" if site is not None else None
    if at is not None and where != at:
        return args, kwargs
    try:
        bound = inspect.signature(init).bind(opt, *args, **kwargs)
    except TypeError:
        return args, kwargs  # the optimizer will say what is wrong with them
    arguments = bound.arguments
    params = arguments.get("params")
    if params is not None and not isinstance(params, list | tuple):
        arguments["params"] = params = list(params)  # a generator is read once: torch.optim reads a list alike
    chosen = implementation if implementation == "foreach" or _fused_supported(params) else "foreach"
    parameters = inspect.signature(init).parameters
    if chosen not in parameters:
        return args, kwargs
    arguments[chosen] = True
    if "foreach" in parameters and chosen == "fused":
        arguments["foreach"] = None
    said(f"{type(opt).__name__}({chosen}=True)" + (f" at {where}" if where else ""))
    return bound.args[1:], bound.kwargs


def _fused_supported(params: Any) -> bool:
    """Whether torch has fused optimizer kernels for every parameter's device, all floating point."""
    try:
        from torch.optim.optimizer import _get_fused_kernels_supported_devices  # type: ignore[attr-defined]

        devices = set(_get_fused_kernels_supported_devices())
    except Exception:  # noqa: BLE001 - a torch without the list: CUDA only
        devices = {"cuda"}
    tensors = [p for group in params for p in (group["params"] if isinstance(group, dict) else [group])]
    return bool(tensors) and all(t.device.type in devices and t.is_floating_point() for t in tensors)


def _optimizer_classes(torch: Any) -> list[type]:
    """torch.optim's optimizers whose __init__ takes `fused` or `foreach`."""
    found = []
    for name in dir(torch.optim):
        cls = getattr(torch.optim, name)
        if isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer) and cls is not torch.optim.Optimizer:
            with contextlib.suppress(TypeError, ValueError):
                if {"fused", "foreach"} & set(inspect.signature(cls).parameters):
                    found.append(cls)
    return found


def _compilable(model: Any) -> bool:
    """A module the script has not compiled (torch.compile's OptimizedModule, or Module.compile already)."""
    from gpudoctor.collect.step_hooks import compiled

    return callable(getattr(model, "compile", None)) and not compiled(model)


def _device_type(model: Any) -> str:
    try:
        return str(next(model.parameters()).device.type)
    except (StopIteration, AttributeError, TypeError):
        return "cuda" if "torch" in sys.modules and sys.modules["torch"].cuda.is_initialized() else "cpu"
