"""What a larger batch would save per sample in a launch-bound step, from how much of the GPU its kernels fill.

A step that waits on the host's launches runs the same launches at a larger batch, so the host's time per step
stays; what grows is the GPU's work. How much it grows depends on how much of the GPU each kernel occupies: CUPTI
gives a kernel's resident warps per SM, and over the SM's most (64 on an H100) that is its *fill*. A kernel that
fills a share f of the GPU runs k times the work in about the same time while k·f stays under 1, and in
proportion after that. So at a batch k times larger a kernel of d seconds takes about d·max(1, k·f), and

    time per sample at k×  ≈  max(S, G·g(k)) / k,   g(k) = Σ d·max(1, k·f) / Σ d

where S is the step at the run's pace and G the GPU's busy time in it. Without the fill (a trace that lacks it)
f is taken as 1: the GPU's work grows with the batch, and the saving per sample is at most the GPU's idle share.

Measured on the recorded fixtures (NVIDIA H100): small_batch_bad's kernels (an MLP at 4 samples) fill 40% of the
GPU, weighted by time, and the model gives 74% less time per sample at 8× the batch; its twin at 64× measured
97%, because a 4-row matrix product's time is reading its weights, which no batch size changes. tiny_batch_ops_bad
(a transformer at 2 sequences) fills 6%: 98% at 64×, against 97% measured at 32×. On five public programs run at
the larger batch (docs/rules.md) it erred high, by up to 18%.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# The batch grows by powers of two, at most this many times: past it, a step's memory and its optimisation
# (learning rate, steps per epoch) change too much for a what-if to stand for it.
MAX_FACTOR = 64
# A growth is enough once its saving per sample is within this of the most a larger batch would save.
NEAR_LIMIT = 0.02


@dataclass(frozen=True)
class BatchGrowth:
    """The batch `factor` times larger: the share of the time per sample it saves (`sample_saving`), the most a
    larger batch would save (`limit`, every kernel filling the GPU), and the kernels' fill of the GPU now, weighted
    by their time (`fill`; None when the trace gives none). `memory_bound`: the device's memory stopped the growth
    short of `limit`."""

    factor: int
    sample_saving: float
    limit: float
    fill: float | None
    memory_bound: bool


def kernel_fills(warps_per_sm: Sequence[float], devices: Sequence[int],
                 max_warps: Mapping[int, float]) -> list[float | None]:
    """Each kernel's fill of its GPU (resident warps per SM over the SM's most, at most 1); None where the trace
    gives no warps, or no maximum for the device."""
    fills: list[float | None] = []
    for warps, device in zip(warps_per_sm, devices, strict=True):
        most = max_warps.get(device)
        usable = most and math.isfinite(warps) and warps > 0
        fills.append(min(1.0, warps / most) if usable else None)  # type: ignore[operator]
    return fills


def batch_growth(step_s: float, busy_s: float, durations: Sequence[float], fills: Sequence[float | None],
                 memory_headroom: float | None) -> BatchGrowth | None:
    """The growth of the batch worth suggesting, and what it saves per sample: the smallest power of two whose
    saving is within NEAR_LIMIT of the limit, at most MAX_FACTOR, and no more than the memory allows
    (`memory_headroom`: how many times the step's peak allocation fits in the device; None: unknown). None when
    the batch cannot grow (no kernels, or memory for less than twice the batch)."""
    total = sum(durations)
    if step_s <= 0 or total <= 0 or (memory_headroom is not None and memory_headroom < 2):
        return None
    known = [(d, f) for d, f in zip(durations, fills, strict=True) if f is not None]
    weighted = [(d, 1.0 if f is None else f) for d, f in zip(durations, fills, strict=True)]

    def saving(k: float) -> float:
        gpu = busy_s * sum(d * max(1.0, k * f) for d, f in weighted) / total
        return 1.0 - max(step_s, gpu) / (k * step_s)

    limit = 1.0 - busy_s * sum(d * f for d, f in weighted) / total / step_s
    memory_cap = MAX_FACTOR if memory_headroom is None else int(memory_headroom)
    factor = 2
    while saving(factor) < limit - NEAR_LIMIT and factor * 2 <= min(MAX_FACTOR, memory_cap):
        factor *= 2
    known_s = sum(d for d, _ in known)
    fill = sum(d * f for d, f in known) / known_s if known_s > 0 else None
    saved = saving(factor)
    return BatchGrowth(factor, max(0.0, saved), limit, fill,
                       memory_bound=saved < limit - NEAR_LIMIT and factor * 2 > memory_cap and factor < MAX_FACTOR)
