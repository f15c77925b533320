"""Which of a step's kernels torch.compile would fuse: the elementwise operations, reductions and normalizations
that PyTorch's eager mode launches one kernel each for (`at::native` elementwise, reduce, layer-norm and softmax
kernels, told by their names), against matrix products, convolutions, copies and library kernels it leaves as they
are. A step that torch.compile has compiled runs Triton kernels (`triton_*`) instead. An eager optimizer's kernels
(foreach off: a handful of elementwise kernels per tensor) are elementwise too, but compiling the model the loop calls
leaves them as they are: they are told by their launch inside `Optimizer.step#`, and GD312 speaks of them."""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass

from gpudoctor.analysis.gpu_ops import GpuOps

FUSIBLE = re.compile(r"elementwise|reduce_kernel|layer_norm|softmax|batch_norm_|norm_kernel|GammaBeta|CatArray"
                     r"|fill_kernel|dropout", re.IGNORECASE)
TRITON = re.compile(r"^triton_", re.IGNORECASE)


@dataclass(frozen=True)
class Fusion:
    """The kernels of the analysed steps: how many, the share of them torch.compile would fuse, and whether any
    is a Triton kernel (a compiled model)."""

    kernels: int
    fusible_share: float
    triton: bool


def fusion(kernels: GpuOps, left_out: Collection[int] = ()) -> Fusion | None:
    """The fusible share of `kernels`, by count (each is a launch); None without kernels. `left_out`: the
    correlation ids of kernels that compiling the model leaves as they are (an eager optimizer's, launched inside
    its step()): launches all the same, never fusible."""
    names, ids = kernels.columns.names, list(kernels.name_ids())
    if not ids:
        return None
    kinds = {i: (bool(FUSIBLE.search(names[i])), bool(TRITON.search(names[i]))) for i in set(ids)}
    kept = [i for i, c in zip(ids, kernels.correlation_ids(), strict=True) if c not in left_out] if left_out else ids
    fusible = sum(1 for i in kept if kinds[i][0])
    return Fusion(len(ids), fusible / len(ids), any(triton for _, triton in kinds.values()))
