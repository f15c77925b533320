"""Which of a step's kernels torch.compile would fuse: the elementwise operations, reductions and normalizations
that PyTorch's eager mode launches one kernel each for (`at::native` elementwise, reduce, layer-norm and softmax
kernels, told by their names), against matrix products, convolutions, copies and library kernels it leaves as they
are. A step that torch.compile has compiled runs Triton kernels (`triton_*`) instead. An eager optimizer's kernels
(foreach off: a handful of elementwise kernels per tensor) are elementwise too, but compiling the model the loop calls
leaves them as they are: they are told by their launch inside `Optimizer.step#`, and GD312 speaks of them.

What compiling leaves of the launches: each run of fusible kernels launched one after another becomes as many kernels
as it holds reductions and normalizations (at least one): inductor folds the elementwise operations around a
reduction into its kernel, and keeps reductions over different dimensions apart (a LayerNorm's backward: two). On
optimizer_fused_fixed (48 Linear + LayerNorm + GELU blocks, H200) this gives 439 launches a step where the compiled
twin measured 443; on elementwise_eager_bad (one run of 935 kernels a step) 98 where compiling, which also fuses
across its RMS norms, launched 35. A matrix product's own helpers (cuBLAS's split-K reduction) stay as they are."""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass

from gpudoctor.analysis.gpu_ops import GpuOps

FUSIBLE = re.compile(r"elementwise|reduce_kernel|layer_norm|softmax|batch_norm_|norm_kernel|GammaBeta|CatArray"
                     r"|fill_kernel|dropout", re.IGNORECASE)
REDUCTION = re.compile(r"reduce_kernel|layer_norm|softmax|batch_norm_|norm_kernel|GammaBeta", re.IGNORECASE)
LIBRARY = re.compile(r"cublas|cutlass|splitK|cudnn|xmma|gemm", re.IGNORECASE)
TRITON = re.compile(r"^triton_", re.IGNORECASE)


@dataclass(frozen=True)
class Fusion:
    """The kernels of the analysed steps: how many, the share of them torch.compile would fuse, the share of the
    launches compiling would leave, and whether any is a Triton kernel (a compiled model)."""

    kernels: int
    fusible_share: float
    triton: bool
    kept_share: float = 1.0


def fusion(kernels: GpuOps, left_out: Collection[int] = ()) -> Fusion | None:
    """The fusible share of `kernels`, by count (each is a launch), in launch order; None without kernels.
    `left_out`: the correlation ids of kernels that compiling the model leaves as they are (an eager optimizer's,
    launched inside its step()): launches all the same, never fusible."""
    names, ids = kernels.columns.names, list(kernels.name_ids())
    if not ids:
        return None
    kinds = {i: _kind(names[i]) for i in set(ids)}
    fusible = kept = in_run = reductions = 0
    for name_id, correlation in zip(ids, kernels.correlation_ids(), strict=True):
        kind = kinds[name_id]
        if kind.fusible and correlation not in left_out:
            fusible, in_run, reductions = fusible + 1, in_run + 1, reductions + kind.reduction
            continue
        if in_run:
            kept += max(1, reductions)
        kept, in_run, reductions = kept + 1, 0, 0
    if in_run:
        kept += max(1, reductions)
    return Fusion(len(ids), fusible / len(ids), any(kind.triton for kind in kinds.values()), kept / len(ids))


@dataclass(frozen=True)
class _Kind:
    fusible: bool
    reduction: bool
    triton: bool


def _kind(name: str) -> _Kind:
    fusible = bool(FUSIBLE.search(name)) and not LIBRARY.search(name)
    return _Kind(fusible, fusible and bool(REDUCTION.search(name)), bool(TRITON.search(name)))
