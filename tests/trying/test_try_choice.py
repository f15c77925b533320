"""Which findings' fixes `--try-fixes` runs (gpudoctor.trying.tries): a fix predicted to save less than two plain runs
differ by is not tried unless its code is asked for. The try itself is stood in for: no process starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudoctor.bundle.findings import FindingLocation, FindingRecord, Tried
from gpudoctor.bundle.manifest import Manifest, Target
from gpudoctor.remedy import LoaderRemedy, Remedy
from gpudoctor.trying import tries
from gpudoctor.trying.settings import TrySettings
from gpudoctor.trying.tries import Diagnosed, try_fixes

STEP_S = 0.0933
RAN = Tried(status="measured", applied="num_workers 0 → 4", step_s=0.05, speedup=STEP_S / 0.05, steps=40)


def _finding(code: str, impact: float | None, workers: int) -> FindingRecord:
    return FindingRecord(
        code=code, name="a finding", category="data_starvation", severity="info", title="a finding",
        impact=impact, saving_s=None if impact is None else impact * STEP_S, evidence=[],
        location=FindingLocation(file="/proj/train.py", line=53), fix="DataLoader(num_workers=4)",
        remedy=Remedy(loader=LoaderRemedy(at="/proj/train.py:53", num_workers=workers)))


@pytest.fixture
def ran(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Remedy]:
    """The remedies a try ran with, in order; each try stands in for a run of the script."""
    remedies: list[Remedy] = []

    def run(self, folder: Path, remedy: Remedy) -> Tried:
        remedies.append(remedy)
        return RAN

    monkeypatch.setattr(tries._Tries, "_run", run)
    return remedies


def _try(tmp_path: Path, findings: list[FindingRecord], settings: TrySettings) -> list[FindingRecord]:
    (tmp_path / "run").mkdir()
    manifest = Manifest(schema_version=1, target=Target(script="train.py"), cwd=str(tmp_path))
    return try_fixes(findings, STEP_S, tmp_path / "run", settings, say=lambda line: None,
                     diagnosed=Diagnosed(tmp_path / "run", manifest, STEP_S))


def test_a_fix_that_saves_less_than_runs_differ_by_is_not_tried(tmp_path: Path, ran: list[Remedy]) -> None:
    """The torchrun straggler's GD202 (a pageable copy, ~1% of rank 0's step) cost a whole run of the job."""
    small, unknown, large = _try(tmp_path, [_finding("GD202", 0.012, 2), _finding("GD402", None, 3),
                                            _finding("GD101", 0.8, 4)], TrySettings())
    assert small.tried is not None and small.tried.status == "not_applicable"
    assert small.tried.reason == ("not tried: it saves ~1.2% of the step, less than two runs of the script differ "
                                  f"by; `gpudoctor try {tmp_path / 'run'} --finding GD202` tries it")
    # a saving not predicted is tried: measuring it is the point
    assert [f.tried.status for f in (unknown, large) if f.tried] == ["measured", "measured"]
    assert [remedy.loader.num_workers for remedy in ran if remedy.loader] == [3, 4]


def test_a_finding_whose_time_a_small_ones_counts_is_not_tried_for_the_same_fix(tmp_path: Path,
                                                                               ran: list[Remedy]) -> None:
    """The torchrun straggler's rank 1 copies images and labels from one unpinned batch: two GD202 findings, the
    second's idle counted in the first's (impact None), one fix. Neither is worth a run of the job."""
    first, second = _finding("GD202", 0.0027, 2), _finding("GD202", None, 2)
    first, second = _try(tmp_path, [first, second], TrySettings())
    assert first.tried is not None and second.tried == first.tried
    assert ran == []


def test_a_small_fix_asked_for_by_its_code_is_tried(tmp_path: Path, ran: list[Remedy]) -> None:
    [small] = _try(tmp_path, [_finding("GD202", 0.012, 2)], TrySettings(finding="GD202"))
    assert small.tried is not None and small.tried.status == "measured"
    assert len(ran) == 1
