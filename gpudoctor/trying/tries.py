"""Try each finding's fix: run the script again with the fix applied at run time, and measure its step.

A try is a `gpudoctor profile` of the same command in the same working directory, with the same profiling window
and a finding's remedy (gpudoctor.remedy) applied in the script's process, stopped after a bounded number of
steps and a time limit. Its step is measured as the diagnosed run's is: `run.step_s`, the run's pace, from the
steps after the window. The tries run one at a time, after the diagnosed run, each into RUN/tries/CODE/ (its
bundle, its own report, the script's output in output.log and the files it wrote in outputs/).

A try is "failed" when the script crashes, hangs past the limit or ends with another exit status than the
diagnosed run's (gpudoctor compares exit statuses, not what the script computed); "not_applicable" when the fix
is an edit of the script, or when the script made nothing the fix changes.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from gpudoctor.bundle import EVENTS
from gpudoctor.bundle.events import EVENT_DECODER, RemedyEvent
from gpudoctor.bundle.findings import Tried
from gpudoctor.bundle.jsonio import read_jsonl
from gpudoctor.bundle.layout import rank_dirs
from gpudoctor.bundle.manifest import Manifest, read_manifest
from gpudoctor.collect.config import WindowConfig
from gpudoctor.errors import GpudoctorError
from gpudoctor.job.layout import is_job_dir
from gpudoctor.launch.profile import ProfileOutcome, ProfileRequest, profile
from gpudoctor.remedy import Remedy
from gpudoctor.report.document import Report
from gpudoctor.trying.outputs import KeptOutputs, OutputsNotIsolated, WorkingDirectory, written_between
from gpudoctor.trying.settings import TrySettings

TRIES_DIR = "tries"
STEPS_AFTER_WINDOW = 20  # steps a try runs after its profiling window: the pace is their mean
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
    "GD301": "the batch size is the script's own: a larger one changes what each step computes",
    "GD501": "moving work from threads to processes is an edit of the script",
    "GD401": "the host's memory is the machine's: the fix is fewer or smaller buffers in the script",
    "GD504": "the other programs on the host are not the script's: give the job its own cores",
    "GD601": "the slow rank's cause is another finding, tried on its own where it can be",
    "GD602": "overlapping communication with the backward pass is an edit of the training loop",
}
TORCHRUN_JOB = "a torchrun job's fixes cannot be tried yet"
NOT_AT_RUN_TIME_DEFAULT = "its fix is an edit of the script, which gpudoctor does not make for it"


@dataclass(frozen=True)
class Diagnosed:
    """The diagnosed run, as its tries repeat it."""

    run_dir: Path
    manifest: Manifest
    step_s: float | None

    @property
    def window(self) -> WindowConfig:
        w = self.manifest.window
        return WindowConfig() if w is None else WindowConfig(wait=w.wait, warmup=w.warmup, active=w.active,
                                                             detail=w.detail, every_s=w.every_s)

    def steps(self, settings: TrySettings) -> int:
        window = self.window
        steps = settings.steps or window.wait + window.length + STEPS_AFTER_WINDOW
        return min(steps, self.manifest.max_steps) if self.manifest.max_steps else steps

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


def try_fixes(report: Report, run_dir: Path, settings: TrySettings, say: Callable[[str], None]) -> Report:
    """The report with `tried` on each finding chosen: its fix measured, or why it was not."""
    if is_job_dir(run_dir):
        return _with_tried(report, settings, lambda f: Tried(status="not_applicable", reason=TORCHRUN_JOB))
    try:
        diagnosed = Diagnosed(run_dir, read_manifest(run_dir), report["run"].get("step_s"))
    except GpudoctorError as exc:
        unread = str(exc)
        return _with_tried(report, settings, lambda f: Tried(status="not_applicable", reason=unread))
    problem = _cannot_try(diagnosed, report)
    if problem is not None:
        return _with_tried(report, settings, lambda f: Tried(status="not_applicable", reason=problem))
    tries = _Tries(diagnosed, settings, say)
    try:
        return _with_tried(report, settings, tries.one)
    finally:
        tries.close()


def _cannot_try(diagnosed: Diagnosed, report: Report) -> str | None:
    manifest = diagnosed.manifest
    if manifest.trace_only or (manifest.target.script is None and manifest.target.module is None):
        return "the run's manifest does not say which script it ran"
    if manifest.cwd is None or not Path(manifest.cwd).is_dir():
        return f"the run's working directory {manifest.cwd} is gone"
    if not diagnosed.step_s:
        return "the diagnosed run has no step time to compare a try's with"
    return None


def _with_tried(report: Report, settings: TrySettings, tried_for: Callable[[dict[str, object]], Tried]) -> Report:
    findings = []
    for finding in report["findings"]:
        chosen = settings.finding is None or finding["code"].startswith(settings.finding)
        findings.append({**finding, "tried": tried_for(dict(finding)).to_json()} if chosen else finding)
    cards = [{**card, "finding": findings[i]} for i, card in enumerate(report["cards"])] if (
        len(report["cards"]) == len(findings)) else report["cards"]
    return {**report, "findings": findings, "cards": cards}  # type: ignore[typeddict-item]


class _Tries:
    """The tries of one diagnosed run, with the script's own outputs kept aside while they run."""

    def __init__(self, diagnosed: Diagnosed, settings: TrySettings, say: Callable[[str], None]) -> None:
        self.diagnosed, self.settings, self.say = diagnosed, settings, say
        self.root = diagnosed.run_dir.resolve() / TRIES_DIR
        self.directory = WorkingDirectory(Path(diagnosed.manifest.cwd or "."), (diagnosed.run_dir.resolve(),))
        self.measured: dict[Remedy, Tried] = {}  # a remedy two findings share is tried once
        self.kept: KeptOutputs | None = None
        self.refused: str | None = None
        self.names: set[str] = set()

    def close(self) -> None:
        if self.kept is not None:
            self.kept.discard()

    def one(self, finding: dict[str, object]) -> Tried:
        code = str(finding["code"])
        if not finding.get("remedy"):
            return Tried(status="not_applicable", reason=NOT_AT_RUN_TIME.get(code, NOT_AT_RUN_TIME_DEFAULT))
        remedy = Remedy.from_json(finding["remedy"])
        if remedy in self.measured:
            return self.measured[remedy]
        if self.kept is None and self.refused is None:
            self._keep_outputs()
        if self.refused is not None:
            return Tried(status="not_applicable", applied=remedy.describe(), reason=f"not tried: {self.refused}")
        self.say(f"trying {code}'s fix: {remedy.describe()}")
        tried = self._run(self._folder(code), remedy)
        self.measured[remedy] = tried
        return tried

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
        shutil.rmtree(folder, ignore_errors=True)  # an earlier try of the same finding
        return folder

    def _run(self, folder: Path, remedy: Remedy) -> Tried:
        assert self.kept is not None
        diagnosed, target = self.diagnosed, self.diagnosed.manifest.target
        folder.mkdir(parents=True)
        request = ProfileRequest(
            script=target.script, module=target.module, args=list(target.args), out=folder,
            window=diagnosed.window, max_steps=diagnosed.steps(self.settings),
            timeout_s=diagnosed.timeout_s(self.settings), with_stack=diagnosed.manifest.with_stack, progress=False,
            remedy=remedy, output_log=folder / OUTPUT_LOG)
        before = self.directory.listing()
        try:
            with _working_directory(self.directory.root):
                outcome = profile(request)
        finally:
            moved = self.kept.after_try(before, folder / OUTPUTS)
        if moved:
            self.say(f"the try wrote {len(moved)} file(s) in {self.directory.root}; they are in {folder / OUTPUTS}")
        return measure(diagnosed, folder, remedy, outcome, request.timeout_s or 0.0)


OUTPUT_LOG = "output.log"
OUTPUTS = "outputs"


def measure(diagnosed: Diagnosed, folder: Path, remedy: Remedy, outcome: ProfileOutcome, timeout_s: float) -> Tried:
    """The try's step at its pace against the diagnosed run's, or why there is none."""
    applied = applied_changes(folder)
    described = "; ".join(applied) or remedy.describe()
    log = folder / OUTPUT_LOG
    if outcome.ending == "timeout":
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
    try:
        pace = _pace(folder)
    except GpudoctorError as exc:
        return Tried(status="failed", applied=described, reason=f"the try's bundle could not be read: {exc}")
    if pace is None or not diagnosed.step_s:
        return Tried(status="failed", applied=described,
                     reason="the try ran no step after its profiling window to time")
    seconds, steps = pace
    return Tried(status="measured", applied=described, step_s=seconds, speedup=diagnosed.step_s / seconds, steps=steps)


def _pace(folder: Path) -> tuple[float, int] | None:
    """The try's step at its pace, as the diagnosed run's (run.step_s), and the steps it is the mean of: a job's,
    whose ranks the script started, is its slowest rank's, as the job's report gives it."""
    from gpudoctor.diagnose import open_run

    bundles = list(rank_dirs(folder).values()) or [folder]
    paces = [open_run(bundle).pace for bundle in bundles]
    slowest = max(paces, key=lambda pace: pace.seconds or 0.0)
    return (slowest.seconds, slowest.steps) if slowest.seconds else None


def applied_changes(folder: Path) -> list[str]:
    """What the try's process changed, as it said (RemedyEvent), in the order it did."""
    path = folder / EVENTS
    if not path.is_file():
        return []
    changes = [event.applied for event in read_jsonl(path, EVENT_DECODER) if isinstance(event, RemedyEvent)]
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
