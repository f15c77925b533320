"""The tiers of tries, and how far a try moved the loss.

A remedy that keeps the computation (tier "same": the loader's settings, threads, a fused optimizer, the allocator)
is tried by `--try-fixes`; one that changes the numbers the step computes (tier "numerics": TF32, bf16 autocast,
torch.compile) only by `--try-fixes=all` (TrySettings.numerics). Every try says its tier, and compares the loss the
script handed to backward() in the try with the diagnosed run's (collect.losses): over the steps both recorded, the
mean absolute difference over the mean absolute loss of the diagnosed run. A script that does not seed its
randomness moves its loss from run to run without any fix: the figure is the fix's only where the script is
repeatable.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

import msgspec

from gpudoctor.bundle import EVENTS
from gpudoctor.bundle.events import EVENT_DECODER, AnyEvent, CompileEvent, LossEvent
from gpudoctor.bundle.findings import Tried
from gpudoctor.bundle.jsonio import read_jsonl
from gpudoctor.bundle.layout import rank_dirs
from gpudoctor.errors import GpudoctorError
from gpudoctor.remedy import Remedy

NOT_TRIED = ("it changes the numerics the step computes: `gpudoctor profile --try-fixes=all` (or `gpudoctor try "
             "--all`) tries it and reports how far the loss moved")


def not_in_tier(remedy: Remedy, numerics: bool) -> Tried | None:
    """Why the remedy is not tried at these settings' tier; None when it is."""
    if remedy.tier == "numerics" and not numerics:
        return Tried(status="not_applicable", applied=remedy.describe(), reason=NOT_TRIED, tier=remedy.tier)
    return None


def with_tier(tried: Tried, remedy: Remedy, diagnosed: Path, tried_in: Path) -> Tried:
    """The try with its remedy's tier, and, when it was measured, how far it moved the loss and, for a fix that
    compiles the model, how long compiling took (apart from the steps timed after it)."""
    measured = tried.status == "measured"
    delta = loss_delta(diagnosed, tried_in) if measured else None
    compiled = _compile_s(tried_in) if measured and remedy.compile else None
    return msgspec.structs.replace(tried, tier=remedy.tier, loss_delta=delta, compile_s=compiled)


def loss_delta(diagnosed: Path, tried_in: Path) -> float | None:
    """The mean absolute difference of the two runs' losses over the steps both recorded, over the mean absolute
    loss of the diagnosed run (a job's: its first rank's); None where either recorded none, or they share no step."""
    before, after = _losses(diagnosed), _losses(tried_in)
    common = sorted(set(before) & set(after))
    if not common:
        return None
    scale = statistics.fmean(abs(before[step]) for step in common)
    if scale == 0:
        return None
    return round(statistics.fmean(abs(after[step] - before[step]) for step in common) / scale, 6)


def _compile_s(run_dir: Path) -> float | None:
    """The seconds torch.compile took in the run (a job's first rank), from dynamo's records; None without any."""
    compiled = [e for e in _events(run_dir) if isinstance(e, CompileEvent)]
    return round(sum(e.seconds for e in compiled), 3) if compiled else None


def _events(run_dir: Path) -> list[AnyEvent]:
    """The events of the run's bundle (a job's first rank's); none where it cannot be read."""
    ranks = rank_dirs(run_dir)
    bundle = min(ranks.items())[1] if ranks else run_dir
    try:
        return list(read_jsonl(bundle / EVENTS, EVENT_DECODER)) if (bundle / EVENTS).is_file() else []
    except (GpudoctorError, OSError):
        return []


def _losses(run_dir: Path) -> dict[int, float]:
    """Each step's mean loss, in the run's bundle (a job's first rank's)."""
    per_step: dict[int, list[float]] = defaultdict(list)
    events = [e for e in _events(run_dir) if isinstance(e, LossEvent)]
    for event in events:
        for step, value in zip(event.steps, event.values, strict=False):
            if value is not None:
                per_step[step].append(value)
    return {step: statistics.fmean(values) for step, values in per_step.items()}
