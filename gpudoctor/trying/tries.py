"""Try each finding's fix: run the script again with the fix applied at run time, and measure its step.

A try is a `gpudoctor profile` of the same command in the same working directory, with the same profiling window
and a finding's remedy (`FindingRecord.remedy`, a gpudoctor.remedy.Remedy) applied in the script's process, stopped
after a bounded number of steps and a time limit; what it measured is the finding's `tried`. Its step is measured
as the diagnosed run's is: the run's pace (`Run.pace`, findings.json's `run.step_s`), from the steps after the
window. The tries run one at a time, after the diagnosed run, each into RUN/tries/CODE/ (its
bundle, which `gpudoctor analyze` reports on, the script's output in output.log and the files it wrote in
outputs/). A job is tried as a whole: a torchrun job by torchrun again (its command kept in the job's directory),
a job whose ranks the script starts by the script again.

A try is "failed" when the script crashes, hangs past the limit or ends with another exit status than the
diagnosed run's (gpudoctor compares exit statuses, not what the script computed), or when the fix was not in effect
in one of its processes, as the try's own bundle tells (gpudoctor.trying.effect: a framework that built the
DataLoader again without it); "not_applicable" when the fix is an edit of the script, or when the script made
nothing the fix changes.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec

from gpudoctor.analysis import Run
from gpudoctor.bundle import EVENTS
from gpudoctor.bundle.confined import inside, leads_out
from gpudoctor.bundle.events import EVENT_DECODER, RemedyEvent
from gpudoctor.bundle.findings import FindingRecord, Tried
from gpudoctor.bundle.jsonio import read_jsonl
from gpudoctor.bundle.layout import MANIFEST, is_job_dir, rank_dirs
from gpudoctor.bundle.manifest import Manifest, read_manifest
from gpudoctor.collect.config import WindowConfig
from gpudoctor.errors import BundleError, GpudoctorError
from gpudoctor.launch.followed import LAUNCHER_DIR
from gpudoctor.launch.inner_job import DONE
from gpudoctor.launch.profile import profile
from gpudoctor.launch.request import ProfileRequest
from gpudoctor.launch.torchrun import JobCommand, read_job_command, run_job
from gpudoctor.remedy import Remedy
from gpudoctor.report.tried import GAIN
from gpudoctor.trying.effect import applied_per_rank, effects, not_in_effect
from gpudoctor.trying.numerics import not_in_tier, with_tier
from gpudoctor.trying.outputs import KeptOutputs, OutputsNotIsolated, WorkingDirectory, remove, written_between
from gpudoctor.trying.reconcile import with_borrowed_tries
from gpudoctor.trying.settings import TrySettings

TRIES_DIR = "tries"
# A try runs as many steps as the diagnosed run, at most this many after its profiling window: a loader's queue,
# filled while its workers start, feeds the first steps (cpu_oversubscription_bad's 16 workers: 32 batches).
STEPS_AFTER_WINDOW = 200
MIN_TIMEOUT_S = 60.0

# Why a built-in rule's fix is not tried: it is an edit of the script, which gpudoctor does not make for it.
NOT_AT_RUN_TIME = {
    "GD101": "a TensorDataset's fix is a BatchSampler with batch_size=None, an edit of the DataLoader call",
    "GD103": "the fix is cheaper samples (preprocessing, augmentation on the GPU): an edit of the dataset",
    "GD201": "the copy's source is not a DataLoader batch: pinning it is an edit where the script makes it",
    "GD202": "the copy's source is not a DataLoader batch: pinning it is an edit where the script makes it",
    "GD203": "the copy to the host is the script's own line: making it asynchronous needs a pinned buffer and "
             "an event, an edit",
    "GD204": "overlapping the copy with the step needs a prefetch of the next batch, an edit of the loop",
    "GD211": "a synchronization is a line of the script: removing it is an edit",
    "GD301": "the model is compiled or replayed as CUDA graphs already: capturing more of the step, or a larger "
             "batch, which changes what each step computes, is an edit of the script",
    "GD312": "the optimizer is not one of torch.optim's: choosing another is an edit of the script",
    "GD314": "a graph break or a recompilation is the script's code: removing it is an edit",
    "GD701": "how often the script saves, evaluates or collects is its own: doing it less often or in the "
             "background is an edit",
    "GD702": "only a loader's workers are tried (persistent workers where it starts them again at each epoch, one "
             "per core where it starts too many): the rest of the start-up is the script's own",
    "GD501": "moving work from threads to processes is an edit of the script",
    "GD401": "the host's memory is the machine's: the fix is fewer or smaller buffers in the script",
    "GD504": "the other programs on the host are not the script's: give the job its own cores",
    "GD601": "the slow rank's cause is another finding, tried on its own where it can be",
    "GD602": "overlapping communication with the backward pass is an edit of the training loop",
}
NOT_AT_RUN_TIME_DEFAULT = "its fix is an edit of the script, which gpudoctor does not make for it"
# A fix predicted to save less of the step than two plain runs of one command differ by (report.tried.GAIN, 5%)
# is not tried unless asked for by its code: its try would cost a whole run and measure noise.
MEASURABLE_SAVING = 1 - 1 / GAIN


@dataclass(frozen=True)
class Diagnosed:
    """The diagnosed run, as its tries repeat it."""

    run_dir: Path
    manifest: Manifest  # the run's; a torchrun job's first rank's
    step_s: float | None
    torchrun: JobCommand | None = None  # a torchrun job: the command each try runs again, as a whole

    @property
    def window(self) -> WindowConfig:
        w = self.manifest.window
        return WindowConfig() if w is None else WindowConfig(wait=w.wait, warmup=w.warmup, active=w.active,
                                                             detail=w.detail, every_s=w.every_s)

    def steps(self, settings: TrySettings) -> int:
        """--try-steps, or as many steps as the diagnosed run, at most STEPS_AFTER_WINDOW after the window."""
        if settings.steps is not None:
            return settings.steps
        window, ran = self.window, self.manifest.exit.steps if self.manifest.exit is not None else None
        steps = window.wait + window.length + STEPS_AFTER_WINDOW
        return min(steps, ran) if ran else steps

    def timeout_s(self, settings: TrySettings) -> float:
        if settings.timeout_s is not None:
            return settings.timeout_s
        return max(MIN_TIMEOUT_S, 2 * (self.manifest.duration_s or 0.0))

    @property
    def exit_status(self) -> int:
        exit_info = self.manifest.exit
        return exit_info.status if exit_info is not None and exit_info.status is not None else 0

    def ran_between(self) -> tuple[float, float] | None:
        if self.manifest.created is None or self.manifest.duration_s is None:
            return None
        started = dt.datetime.fromisoformat(self.manifest.created).timestamp()
        return started, started + self.manifest.duration_s


def try_fixes(findings: list[FindingRecord], step_s: float | None, run_dir: Path, settings: TrySettings,
              say: Callable[[str], None], diagnosed: Diagnosed | None = None) -> list[FindingRecord]:
    """The findings of the run in `run_dir`, whose step at its pace is `step_s`, with `tried` on each one chosen: its
    fix measured, or why it was not. `diagnosed`: the run as its user confirmed it (gpudoctor.trying.consent), else
    as the run directory has it now."""
    try:
        run = diagnosed or diagnosed_run(run_dir, step_s)
        problem = cannot_try(run)
    except GpudoctorError as exc:
        problem = str(exc)
    if problem is not None:
        refused = Tried(status="not_applicable", reason=problem)
        return _with_tried(findings, settings, lambda f: refused)
    tries = _Tries(run, settings, say)
    try:
        return with_borrowed_tries(_with_tried(findings, settings, tries.one), step_s)
    finally:
        tries.close()


def diagnosed_run(run_dir: Path, step_s: float | None) -> Diagnosed:
    """The run as its tries repeat it: its manifest; for a job whose ranks the script started, the script's own
    (launcher/, or its first rank's when the script trained as one, as Lightning's does); for a torchrun job that
    gpudoctor started, its command and its first rank's manifest."""
    if not is_job_dir(run_dir):
        return Diagnosed(run_dir, read_manifest(run_dir), step_s)
    command = read_job_command(run_dir)
    ranks = rank_dirs(run_dir)
    first = min(ranks.items())[1]
    if command is not None:
        return Diagnosed(run_dir, read_manifest(first), step_s, command)
    first_manifest = read_manifest(first)
    if first_manifest.launch is not None and first_manifest.launch.world_size > len(ranks):
        raise BundleError(f"{run_dir} holds {len(ranks)} of the job's {first_manifest.launch.world_size} ranks, the "
                          "others ran on other nodes: gpudoctor tries a job's fixes by running the whole job again, "
                          "which it can do only for a job of one node")
    if first_manifest.launch is not None or any((bundle / DONE).exists() for bundle in ranks.values()):
        # a launcher around gpudoctor (torchrun, srun, mpirun): the user's command, which gpudoctor does not know
        who = first_manifest.launch.launcher if first_manifest.launch is not None else "torchrun"
        raise BundleError(f"{run_dir} is a job that {who} started around gpudoctor, whose command gpudoctor does "
                          "not know: profile it as "
                          "`gpudoctor profile --try-fixes torchrun ...` to try its fixes")
    launcher = run_dir / LAUNCHER_DIR
    if launcher.exists() and not inside(run_dir, launcher):
        raise leads_out(run_dir, launcher)
    return Diagnosed(run_dir, read_manifest(launcher if (launcher / MANIFEST).is_file() else first), step_s)


def cannot_try(diagnosed: Diagnosed) -> str | None:
    manifest = diagnosed.manifest
    if manifest.trace_only or (manifest.target.script is None and manifest.target.module is None):
        return "the run's manifest does not say which script it ran"
    if manifest.cwd is None or not Path(manifest.cwd).is_dir():
        return f"the run's working directory {manifest.cwd} is gone"
    if not diagnosed.step_s:
        return "the diagnosed run has no step time to compare a try's with"
    tries = diagnosed.run_dir / TRIES_DIR
    if not inside(diagnosed.run_dir, tries):
        return f"{tries} is a link out of the run directory, and gpudoctor writes the tries only inside it"
    return None


def chosen(finding: FindingRecord, settings: TrySettings) -> bool:
    """Whether the finding's fix is to be tried (--finding)."""
    return settings.finding is None or finding.code.startswith(settings.finding)


def _with_tried(findings: list[FindingRecord], settings: TrySettings,
                tried_for: Callable[[FindingRecord], Tried]) -> list[FindingRecord]:
    """Each chosen finding with what its try gave."""
    return [msgspec.structs.replace(f, tried=tried_for(f)) if chosen(f, settings) else f for f in findings]


class _Tries:
    """The tries of one diagnosed run, with the script's own outputs kept aside while they run."""

    def __init__(self, diagnosed: Diagnosed, settings: TrySettings, say: Callable[[str], None]) -> None:
        self.diagnosed, self.settings, self.say = diagnosed, settings, say
        self.root = diagnosed.run_dir.resolve() / TRIES_DIR
        self.directory = WorkingDirectory(Path(diagnosed.manifest.cwd or "."), (diagnosed.run_dir.resolve(),))
        self.measured: dict[Remedy, Tried] = {}  # a remedy two findings share is tried once
        self.too_small: dict[Remedy, Tried] = {}  # and one too small to measure is said so once for both
        self.kept: KeptOutputs | None = None
        self.refused: str | None = None
        self.names: set[str] = set()

    def close(self) -> None:
        if self.kept is not None:
            self.kept.discard()

    def one(self, finding: FindingRecord) -> Tried:
        code, remedy = finding.code, finding.remedy
        if remedy is None:
            return Tried(status="not_applicable", reason=NOT_AT_RUN_TIME.get(code, NOT_AT_RUN_TIME_DEFAULT))
        if remedy in self.measured:
            return self.measured[remedy]
        too_small = self._too_small(finding, remedy)
        if too_small is not None:
            return too_small
        refused = not_in_tier(remedy, self.settings.numerics)
        if refused is not None:
            return refused
        if self.kept is None and self.refused is None:
            self._keep_outputs()
        if self.refused is not None:
            return Tried(status="not_applicable", applied=remedy.describe(), reason=f"not tried: {self.refused}")
        self.say(f"trying {code}'s fix: {remedy.describe()}")
        folder = self._folder(code)
        tried = with_tier(self._run(folder, remedy), remedy, self.diagnosed.run_dir, folder)
        self.measured[remedy] = tried
        return tried

    def _too_small(self, finding: FindingRecord, remedy: Remedy) -> Tried | None:
        """Why the fix is not tried where it is predicted to save less than MEASURABLE_SAVING, unless --finding
        asked for it. A finding whose time another counts (its impact None) shares that one's answer for the same
        fix: two GD202 copies of one batch, the second's idle counted in the first's."""
        if self.settings.finding is not None:
            return None
        if finding.impact is None:
            return self.too_small.get(remedy)
        if finding.impact >= MEASURABLE_SAVING:
            return None
        self.too_small[remedy] = Tried(status="not_applicable", applied=remedy.describe(), reason=(
            f"not tried: it saves ~{finding.impact:.1%} of the step, less than two runs of the script differ by; "
            f"`gpudoctor try {self.diagnosed.run_dir} --finding {finding.code}` tries it"))
        return self.too_small[remedy]

    def _keep_outputs(self) -> None:
        ran = self.diagnosed.ran_between()
        try:
            listing = self.directory.listing()
            written = written_between(listing, *ran) if ran is not None else []
            self.kept = KeptOutputs(self.directory, written, self.root / ".kept")
        except (OutputsNotIsolated, OSError) as exc:
            self.refused = str(exc)

    def _folder(self, code: str) -> Path:
        name, n = code, 2
        while name in self.names:
            name, n = f"{code}-{n}", n + 1
        self.names.add(name)
        folder = self.root / name
        remove(folder)  # an earlier try of the same finding
        return folder

    def _run(self, folder: Path, remedy: Remedy) -> Tried:
        assert self.kept is not None
        folder.mkdir(parents=True)
        steps, timeout_s = self.diagnosed.steps(self.settings), self.diagnosed.timeout_s(self.settings)
        before = self.directory.listing()
        try:
            with _working_directory(self.directory.root):
                ended = (_run_job if self.diagnosed.torchrun else _run_script)(
                    self.diagnosed, folder, remedy, steps, timeout_s)
        finally:
            moved = self.kept.after_try(before, folder / OUTPUTS)
        if moved:
            self.say(f"the try wrote {len(moved)} file(s) in {self.directory.root}; they are in {folder / OUTPUTS}")
        tried = measure(self.diagnosed, folder, remedy, ended, timeout_s)
        return msgspec.structs.replace(tried, bundle=f"{TRIES_DIR}/{folder.name}")


@dataclass(frozen=True)
class Ended:
    """How a try's run ended."""

    exit_status: int
    timed_out: bool


def _run_script(diagnosed: Diagnosed, folder: Path, remedy: Remedy, steps: int, timeout_s: float) -> Ended:
    """The script again, as the diagnosed run started it (its ranks, where it starts them itself)."""
    target = diagnosed.manifest.target
    outcome = profile(ProfileRequest(
        script=target.script, module=target.module, args=list(target.args), out=folder, window=diagnosed.window,
        max_steps=steps, timeout_s=timeout_s, with_stack=diagnosed.manifest.with_stack, progress=False,
        remedy=remedy, output_log=folder / OUTPUT_LOG))
    return Ended(outcome.exit_status, outcome.ending == "timeout")


def _run_job(diagnosed: Diagnosed, folder: Path, remedy: Remedy, steps: int, timeout_s: float) -> Ended:
    """A torchrun job again, whole: every rank a `gpudoctor profile` with the remedy (it says which rank it is for),
    stopped after `steps` steps or `timeout_s` seconds, as the diagnosed job's options had it."""
    command = diagnosed.torchrun
    assert command is not None
    bounded = [*command.rank_options, "--max-steps", str(steps), "--timeout", f"{timeout_s:g}",
               "--remedy", json.dumps(remedy.to_json())]
    outcome = run_job(command.job, folder, bounded, output_log=folder / OUTPUT_LOG)
    return Ended(outcome.exit_status, _a_rank_timed_out(folder))


def _a_rank_timed_out(folder: Path) -> bool:
    for bundle in rank_dirs(folder).values():
        try:
            exit_info = read_manifest(bundle).exit
        except GpudoctorError:
            continue
        if exit_info is not None and exit_info.ending == "timeout":
            return True
    return False


OUTPUT_LOG = "output.log"
OUTPUTS = "outputs"


def measure(diagnosed: Diagnosed, folder: Path, remedy: Remedy, outcome: Ended, timeout_s: float) -> Tried:
    """The try's step at its pace against the diagnosed run's, or why there is none."""
    applied = applied_changes(folder)
    described = "; ".join(applied) or remedy.describe()
    log = folder / OUTPUT_LOG
    if outcome.timed_out:
        return Tried(status="failed", applied=described,
                     reason=f"with the fix the script had not finished {timeout_s:g} s later; its output is in {log}")
    if outcome.exit_status != diagnosed.exit_status:
        return Tried(status="failed", applied=described,
                     reason=f"with the fix the script exited with status {outcome.exit_status} (without it, "
                            f"{diagnosed.exit_status}); its output is in {log}")
    if not applied:
        return Tried(status="not_applicable", applied=remedy.describe(),
                     reason="the script made nothing that the fix changes (no such DataLoader, copy or setting)")
    if remedy.non_blocking_batches and not any("non_blocking" in change for change in applied):
        return Tried(status="not_applicable", applied=described, reason=NOT_AT_RUN_TIME["GD201"])
    found = effects(remedy, diagnosed.run_dir, folder)
    described, changes = applied_per_rank(found) or described, [c for e in found for c in e.changes] or None
    missing = not_in_effect(found)
    if missing is not None:  # the step it ran says nothing of the fix
        return Tried(status="failed", applied=described, reason=missing, changes=changes)
    try:
        pace = _pace(folder)
    except GpudoctorError as exc:
        return Tried(status="failed", applied=described, reason=f"the try's bundle could not be read: {exc}",
                     changes=changes)
    if pace is None or not diagnosed.step_s:
        return Tried(status="failed", applied=described, changes=changes,
                     reason="the try ran no step after its profiling window to time")
    seconds, steps = pace
    return Tried(status="measured", applied=described, step_s=seconds, speedup=diagnosed.step_s / seconds, steps=steps,
                 changes=changes, workers_start_s=_workers_start(diagnosed.run_dir, folder, remedy))


def _workers_start(diagnosed: Path, tried: Path, remedy: Remedy) -> list[float] | None:
    """For a fix of how many workers the loader starts: their first start in the diagnosed run and in the try's
    (analysis.startup's "loader_workers"), seconds; None for another fix, a job, or a run that did not time it."""
    if remedy.loader is None or remedy.loader.num_workers is None or rank_dirs(tried):
        return None
    starts = []
    for run_dir in (diagnosed, tried):
        try:
            startup = Run.from_bundle(run_dir).job_time.startup
        except GpudoctorError:
            return None
        if startup is None:
            return None
        starts.append(round(startup.phases.get("loader_workers", 0.0), 3))
    return starts


def _pace(folder: Path) -> tuple[float, int] | None:
    """The try's step at its pace, as the diagnosed run's (run.step_s), and the steps it is the mean of: a job's,
    whose ranks the script started, is its slowest rank's, as the job's report gives it."""
    bundles = list(rank_dirs(folder).values()) or [folder]
    paces = [Run.from_bundle(bundle).pace for bundle in bundles]
    slowest = max(paces, key=lambda pace: pace.seconds or 0.0)
    return (slowest.seconds, slowest.steps) if slowest.seconds else None


def applied_changes(folder: Path) -> list[str]:
    """What the try's processes changed, as they said (RemedyEvent), in the order they did: the script's own, and
    its ranks' where it started ranks (their bundles are rank-K/, the script's own launcher/ when it only started
    them)."""
    bundles = [folder, *rank_dirs(folder).values(), folder / LAUNCHER_DIR]
    changes = [event.applied for bundle in bundles if (bundle / EVENTS).is_file()
               for event in read_jsonl(bundle / EVENTS, EVENT_DECODER) if isinstance(event, RemedyEvent)]
    return list(dict.fromkeys(changes))


@contextlib.contextmanager
def _working_directory(path: Path) -> Iterator[None]:
    """Run in `path`, as the diagnosed run did (contextlib.chdir is Python 3.11's)."""
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)
