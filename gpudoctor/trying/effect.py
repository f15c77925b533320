"""Whether a try's fix took effect, rank by rank: the settings each process of the try had, as its own bundle
records them, against the remedy, and against what the diagnosed run had.

A process says what it changed as it changes it (RemedyEvent), but a framework can undo it afterwards: Lightning
builds each rank's DataLoader again, from the arguments the script first gave, to add a DistributedSampler. So a
try is read back from what its processes ran with: each DataLoader as it was first iterated (LoaderEvent: its
workers, their persistence and start method, pinning, the threads the remedy's worker_init_fn sets) and torch's
intra-op threads when the profiling window opened (EnvWindowEvent). A setting the remedy names that a process
ran without makes the try `failed`, never `measured`: its step says nothing of the fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpudoctor.bundle import EVENTS
from gpudoctor.bundle.events import EVENT_DECODER, AnyEvent, EnvWindowEvent, LoaderEvent
from gpudoctor.bundle.findings import SettingValue, TriedChange
from gpudoctor.bundle.jsonio import read_jsonl
from gpudoctor.bundle.layout import rank_dirs
from gpudoctor.errors import GpudoctorError
from gpudoctor.remedy import LOADER_SETTINGS, Remedy

# The libraries that build a script's DataLoader (LoaderEvent.made_by), as a sentence names them, and whether they
# build it again from the script's own (a re-creation) or from their own arguments.
BUILDERS = {
    "lightning": ("re-created", "Lightning"), "pytorch_lightning": ("re-created", "Lightning"),
    "accelerate": ("re-created", "Accelerate"), "transformers": ("built", "Hugging Face's Trainer"),
}
NEED_WORKERS = ("persistent_workers", "prefetch_factor", "start_method", "worker_threads")  # moot without workers


@dataclass(frozen=True)
class Effect:
    """What a try changed in one process (`rank`, None in a run of one process), and where the remedy was not in
    effect there, why (`missing`: 'its DataLoader was re-created by Lightning with num_workers=0')."""

    rank: int | None
    changes: list[TriedChange]
    missing: str | None = None


def effects(remedy: Remedy, diagnosed_dir: Path, try_dir: Path) -> list[Effect]:
    """Each process of the try (a job's ranks, by rank), its settings against the remedy and the diagnosed run's
    same process. A bundle that cannot be read is left out: the try's own measurement says what is wrong with it."""
    tried, diagnosed = _bundles(try_dir), _bundles(diagnosed_dir)
    found = []
    for rank, bundle in tried.items():
        if remedy.rank is not None and rank is not None and rank != remedy.rank:
            continue  # a remedy for one rank leaves the others as they ran
        try:
            after = _events(bundle)
            before = _events(diagnosed[rank]) if rank in diagnosed else []
        except GpudoctorError:
            continue
        found.append(_effect(remedy, rank, before, after))
    return found


def not_in_effect(found: list[Effect]) -> str | None:
    """'not in effect on rank 1: its DataLoader was re-created by Lightning with num_workers=0', or None where the
    remedy was in effect in every process."""
    missing = [e for e in found if e.missing is not None]
    if not missing:
        return None
    said = [f"on rank {e.rank}: {e.missing}" if e.rank is not None else e.missing or "" for e in missing]
    if missing[0].rank is None:
        return f"not in effect: {said[0]}"
    return "not in effect " + "; ".join(said)


def applied_per_rank(found: list[Effect]) -> str | None:
    """'rank 0: num_workers 6 → 15; rank 1: 0 → 15': what the try changed on each rank of a job, a setting's name
    left out where the rank before changed the same ones; None for a run of one process, or no change read."""
    ranks = [e for e in found if e.rank is not None and e.changes]
    if not ranks:
        return None
    parts, names_before = [], None
    for effect in ranks:
        names = [c.setting for c in effect.changes]
        named = names != names_before
        shown = ", ".join(f"{c.setting + ' ' if named else ''}{_value(c.before)} → {_value(c.after)}"
                          for c in effect.changes)
        parts.append(f"rank {effect.rank}: {shown}")
        names_before = names
    return "; ".join(parts)


def _value(value: SettingValue) -> str:
    return "not set" if value is None else str(value)


# -- one process --------------------------------------------------------------------------------------------
def _bundles(folder: Path) -> dict[int | None, Path]:
    """A job's rank bundles, by rank, or the run's own bundle (rank None)."""
    ranks = rank_dirs(folder)
    if ranks:
        return dict(ranks.items())
    return {None: folder} if (folder / EVENTS).is_file() else {}


def _events(bundle: Path) -> list[AnyEvent]:
    return list(read_jsonl(bundle / EVENTS, EVENT_DECODER)) if (bundle / EVENTS).is_file() else []


def _effect(remedy: Remedy, rank: int | None, before: list[AnyEvent], after: list[AnyEvent]) -> Effect:
    changes: list[TriedChange] = []
    missing: list[str] = []
    if remedy.loader is not None or remedy.start_method is not None:
        loader_changes, loader_missing = _loaders(remedy, rank, before, after)
        changes += loader_changes
        missing += loader_missing
    if remedy.intra_op_threads is not None:
        threads_before, threads_after = _threads(before), _threads(after)
        if threads_after is not None and threads_after != remedy.intra_op_threads:
            missing.append(f"torch ran {threads_after} intra-op threads")
        if threads_after is not None and threads_after != threads_before:
            changes.append(TriedChange(rank=rank, setting="intra_op_threads", before=threads_before,
                                       after=threads_after))
    return Effect(rank, changes, "; ".join(missing) or None)


def _threads(events: list[AnyEvent]) -> int | None:
    """torch's intra-op threads in the training process when its (first) profiling window opened."""
    return next((e.intra_op_threads for e in events if isinstance(e, EnvWindowEvent)), None)


def _loaders(remedy: Remedy, rank: int | None, before: list[AnyEvent],
             after: list[AnyEvent]) -> tuple[list[TriedChange], list[str]]:
    """The changes to the loaders the remedy names (the first of them where several were built at its line, as
    the training loader is the first iterated), and what of the remedy a loader ran without."""
    tried, diagnosed = _named(remedy, after), _named(remedy, before)
    if not tried:
        return [], []
    loader = tried[0]
    wanted = _wanted(remedy, loader, _used_a_gpu(after))
    changes = []
    had = _settings(diagnosed[0]) if diagnosed else {}
    has = _settings(loader)
    for name in wanted:
        if not loader.num_workers and name in NEED_WORKERS:
            continue  # a change to the workers of a loader that ran without any changed nothing it ran with
        if has.get(name) != had.get(name) and (diagnosed or has.get(name) is not None):
            changes.append(TriedChange(rank=rank, setting=name, before=had.get(name), after=has.get(name)))
    off = {name: has.get(name) for name, value in wanted.items() if has.get(name) != value
           and (loader.num_workers or name not in NEED_WORKERS)}  # without workers, those say nothing more
    return changes, [_loader_missing(loader, off)] if off else []


def _named(remedy: Remedy, events: list[AnyEvent]) -> list[LoaderEvent]:
    """The loaders a remedy names, as first iterated: those built at its line (every loader when it names none)."""
    at = remedy.loader.at if remedy.loader is not None else None
    loaders = [e for e in events if isinstance(e, LoaderEvent)]
    return [e for e in loaders if at is None or (e.site is not None and f"{e.site.file}:{e.site.line}" == at)]


def _settings(loader: LoaderEvent) -> dict[str, SettingValue]:
    return {"num_workers": loader.num_workers, "pin_memory": loader.pin_memory,
            "persistent_workers": loader.persistent_workers, "prefetch_factor": loader.prefetch_factor,
            "start_method": loader.start_method, "worker_threads": loader.worker_threads}


def _wanted(remedy: Remedy, loader: LoaderEvent, gpu: bool) -> dict[str, SettingValue]:
    """The settings the remedy gives this loader, as collect.remedies applies them: those that need workers only
    where it has them, pinning only in a process that used a GPU."""
    wanted: dict[str, SettingValue] = {}
    fix = remedy.loader
    if fix is not None:
        for name in LOADER_SETTINGS:
            value = getattr(fix, name)
            if value is not None:
                wanted["start_method" if name == "multiprocessing_context" else name] = value
        if fix.worker_threads is not None:
            wanted["worker_threads"] = fix.worker_threads
    if remedy.start_method is not None:
        wanted["start_method"] = remedy.start_method
    workers = wanted.get("num_workers", loader.num_workers)
    if not workers:
        wanted = {name: value for name, value in wanted.items() if name not in NEED_WORKERS}
    if wanted.get("pin_memory") and not gpu:
        del wanted["pin_memory"]
    return wanted


def _used_a_gpu(events: list[AnyEvent]) -> bool:
    return any(isinstance(e, EnvWindowEvent) and e.cuda_device is not None for e in events)


def _loader_missing(loader: LoaderEvent, off: dict[str, SettingValue]) -> str:
    """'its DataLoader was re-created by Lightning with num_workers=0'; 'its DataLoader at train.py:53 ran with
    num_workers=0' where the script built it itself."""
    settings = ", ".join(f"{name}={value!r}" for name, value in off.items())
    builder = BUILDERS.get(loader.made_by or "") or (("built", loader.made_by) if loader.made_by else None)
    if builder is not None:
        how, who = builder
        return f"its DataLoader was {how} by {who} with {settings}"
    where = f" at {loader.site.file}:{loader.site.line}" if loader.site is not None else ""
    return f"its DataLoader{where} ran with {settings}"
