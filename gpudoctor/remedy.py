"""A fix that gpudoctor can apply at run time, without editing the script: what `--try-fixes` runs the script with.

A rule attaches one to its finding (`Finding(..., remedy=Remedy(...))`) when its fix is a setting that the
instrumentation can change from outside: a DataLoader's arguments, the intra-op threads, the multiprocessing
start method, non-blocking copies of pinned loader batches, the optimizer's implementation, the CUDA allocator's
settings; and, changing the numerics, TF32 matmuls, bf16 autocast around the model and torch.compile of it. The
script's process applies it (gpudoctor.collect.remedies, gpudoctor.collect.step_remedies); findings.json keeps it
beside the finding, as `remedy`.

Each remedy has a tier (`Remedy.tier`): "same", a fix that keeps the computation (the same math, rounded alike
or in another order: a fused optimizer's update), which `--try-fixes` tries; or "numerics", a fix that changes
the numbers the step computes (lower precision, compiled kernels), which only `--try-fixes=all` tries, and whose
try reports how far the loss moved.
"""

from __future__ import annotations

from typing import Any, cast

import msgspec

# DataLoader arguments a remedy may set, in the order the description gives them.
LOADER_SETTINGS = ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor", "multiprocessing_context")


class LoaderRemedy(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """DataLoader arguments to set (None: left as the script has it), for the loaders built at `at` ("file:line"),
    or every loader when `at` is None. `worker_threads`: each worker's intra-op threads, set after the script's
    own worker_init_fn."""

    at: str | None = None
    num_workers: int | None = None
    pin_memory: bool | None = None
    persistent_workers: bool | None = None
    prefetch_factor: int | None = None
    multiprocessing_context: str | None = None
    worker_threads: int | None = None

    def settings(self) -> dict[str, Any]:
        """The DataLoader keyword arguments this remedy sets."""
        return {name: getattr(self, name) for name in LOADER_SETTINGS if getattr(self, name) is not None}


TIERS = ("same", "numerics")  # a fix that keeps the computation; one that changes its numerics
# torch.optim's choices of implementation a remedy may make: one fused kernel for every tensor, or the foreach one.
OPTIMIZER_IMPLEMENTATIONS = ("fused", "foreach")


class OptimizerRemedy(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """The implementation of the optimizers built at `at` ("file:line"; every torch.optim optimizer when None):
    "fused" (one kernel for every tensor, where torch has one for the optimizer and the parameters' device; else
    foreach) or "foreach"."""

    at: str | None = None
    implementation: str = "fused"


class Remedy(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """What a try changes. `rank`: only that rank of a job (None: every process that runs the script's code)."""

    loader: LoaderRemedy | None = None
    intra_op_threads: int | None = None
    start_method: str | None = None
    non_blocking_batches: bool = False  # copies of pinned loader batches to the GPU get non_blocking=True
    rank: int | None = None
    optimizer: OptimizerRemedy | None = None
    # PYTORCH_CUDA_ALLOC_CONF settings added before CUDA starts ("expandable_segments:True")
    alloc_conf: str | None = None
    # -- fixes that change the numerics (tier "numerics") --
    matmul_precision: str | None = None  # torch.set_float32_matmul_precision: "high" runs fp32 matmuls in TF32
    autocast: str | None = None  # a dtype ("bfloat16"): autocast around each call of the outermost model
    compile: str | None = None  # a torch.compile backend ("inductor"): the outermost model run through torch.compile

    @property
    def tier(self) -> str:
        """"numerics" when the remedy changes what the step computes (precision, compilation), else "same"."""
        return "numerics" if (self.matmul_precision or self.autocast or self.compile) else "same"

    def describe(self) -> str:
        """What the try changes, in the script's terms: 'DataLoader(num_workers=6, persistent_workers=True) at
        train.py:74'."""
        parts = []
        if self.loader is not None:
            arguments = [f"{name}={value!r}" for name, value in self.loader.settings().items()]
            if self.loader.worker_threads is not None:
                arguments.append(f"worker_init_fn=... torch.set_num_threads({self.loader.worker_threads})")
            where = f" at {self.loader.at}" if self.loader.at else ""
            parts.append(f"DataLoader({', '.join(arguments)}){where}")
        if self.intra_op_threads is not None:
            parts.append(f"torch.set_num_threads({self.intra_op_threads}) and OMP_NUM_THREADS={self.intra_op_threads}")
        if self.start_method is not None:
            parts.append(f'multiprocessing start method "{self.start_method}"')
        if self.non_blocking_batches:
            parts.append("non_blocking=True on copies of the loader's pinned batches")
        parts += self._step_parts()
        text = "; ".join(parts) or "nothing"
        return text if self.rank is None else f"{text}, on rank {self.rank}"

    def _step_parts(self) -> list[str]:
        """What the remedy changes in the step itself, in the script's terms."""
        parts = []
        if self.optimizer is not None:
            where = f" at {self.optimizer.at}" if self.optimizer.at else ""
            parts.append(f"optimizer({self.optimizer.implementation}=True){where}")
        if self.alloc_conf is not None:
            parts.append(f"PYTORCH_CUDA_ALLOC_CONF={self.alloc_conf}")
        if self.matmul_precision is not None:
            parts.append(f'torch.set_float32_matmul_precision("{self.matmul_precision}")')
        if self.autocast is not None:
            parts.append(f"torch.autocast(dtype=torch.{self.autocast}) around the model's calls")
        if self.compile is not None:
            parts.append(f'torch.compile(model, backend="{self.compile}") on the model the loop calls')
        return parts

    def contains(self, other: Remedy) -> bool:
        """Whether applying this remedy makes every change `other` makes, as `other` makes it: the same change, or
        one that holds it (a loader's workers and pinned memory hold its pinned memory alone), on the same ranks.
        A remedy that changes nothing holds nothing."""
        if self.rank != other.rank or other == Remedy(rank=other.rank):
            return False
        return _holds(self, other)

    def to_json(self) -> dict[str, Any]:
        return cast("dict[str, Any]", msgspec.to_builtins(self))

    @classmethod
    def from_json(cls, data: object) -> Remedy:
        return msgspec.convert(data, cls)


def _holds(outer: msgspec.Struct, inner: msgspec.Struct) -> bool:
    """Each field `inner` sets (not its default) set alike in `outer`; a nested remedy (a loader's, an optimizer's)
    compared the same way, where both name the same place (`at`)."""
    for field in msgspec.structs.fields(inner):
        value = getattr(inner, field.name)
        if value == field.default:
            continue
        held = getattr(outer, field.name)
        if isinstance(value, msgspec.Struct):
            if not isinstance(held, type(value)) or getattr(held, "at", None) != getattr(value, "at", None):
                return False
            if not _holds(held, value):
                return False
        elif held != value:
            return False
    return True
