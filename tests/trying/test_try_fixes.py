"""`gpudoctor profile --try-fixes` and `gpudoctor try`: a finding's fix applied at run time, measured against the
fixed twin's speed-up, kept apart from the script's own files, and a fix that breaks the script reported as failed
with the diagnosed run's report intact."""

from __future__ import annotations

import datetime as dt
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

from conftest import Gpudoctor, Result, checked_findings, env_with, script
from gpudoctor.launch.profile import ProfileRequest, profile
from gpudoctor.remedy import LoaderRemedy, Remedy

STARVED = script("starved_loader.py")
TWIN_ARGS = ("--workers", "2", "--persistent")  # the fixed twin: what GD101's fix suggests on two cores
BAND = 0.10  # the tried speed-up is within ±10% of the twin's, in the median of three rounds


def _finding(result: Result, code: str) -> dict:
    return next(f for f in result.findings()["findings"] if f["code"] == code)


def _plain_step_s(cwd: Path, *args: str) -> float:
    """The script's steady step run plainly: the faster of two runs, since a run on two shared cores is only ever
    slowed (the fixed twin alone came out 1.29x to 2.26x in six rounds of one run each, the try 2.07x to 2.34x)."""
    return min(_one_plain_step_s(cwd, *args) for _ in range(2))


def _one_plain_step_s(cwd: Path, *args: str) -> float:
    done = subprocess.run([sys.executable, STARVED, *args], cwd=cwd, env=env_with(), capture_output=True, text=True,
                          timeout=120, check=True)
    return json.loads(done.stdout.splitlines()[-1])["mean_step_s"]


def _profile_with_tries(tmp_path_factory: pytest.TempPathFactory) -> Result:
    gd = Gpudoctor(tmp_path_factory.mktemp("tried"))
    return gd.profile(STARVED, "--checkpoint", "model.pt", options=("--try-fixes",))


@pytest.fixture(scope="module")
def tried(tmp_path_factory: pytest.TempPathFactory) -> Result:
    return _profile_with_tries(tmp_path_factory)


def _measured(result: Result) -> dict:
    assert result.returncode == 0, result
    gd101 = _finding(result, "GD101")
    assert gd101["remedy"]["loader"]["num_workers"] == 2
    measured = gd101["tried"]
    assert measured["status"] == "measured", measured
    assert measured["applied"].startswith("DataLoader(num_workers=2, persistent_workers=True) at ")
    assert measured["steps"] >= 10
    return measured


class Round(NamedTuple):
    """One profile with the try, and the fixed twin's plain runs made right after it."""

    tried: float  # the tried speed-up: the diagnosed run's step over the try's
    twin: float  # the bad script's plain step over the fixed one's
    contended: bool  # other programs took the host's CPU while the profile ran (it found GD504)

    @property
    def off(self) -> float:
        return self.tried / self.twin - 1


def _round(result: Result) -> Round:
    cwd = result.run_dir.parent
    contended = any(f["code"] == "GD504" for f in result.findings()["findings"])
    return Round(_measured(result)["speedup"], _plain_step_s(cwd) / _plain_step_s(cwd, *TWIN_ARGS), contended)


@pytest.mark.e2e
def test_the_starved_loaders_fix_is_measured_within_the_band_of_its_twin(
        tried: Result, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The band holds for the median of three rounds: load on a shared machine during one round cannot decide it
    (one round on two loaded cores came out 10.26% off). When the first two rounds are within the band, so is the
    median of three, and the third is not run. A round measured while other programs took the host's CPU (its
    profile found GD504) is set aside: they slow the bad script and its fix by shares of their own (rounds on a host
    92-99% busy came out 13% to 66% off, either way); with no other round, the test is skipped, saying so."""
    rounds = [_round(tried), _round(_profile_with_tries(tmp_path_factory))]
    if any(abs(r.off) > BAND for r in rounds):
        rounds.append(_round(_profile_with_tries(tmp_path_factory)))
    counted = [r for r in rounds if not r.contended]
    if not counted:
        pytest.skip(f"other programs took the host's CPU in every round (GD504), so no speed-up measured here is the "
                    f"fix's alone: {rounds}")
    assert abs(statistics.median(r.off for r in counted)) <= BAND, rounds
    measured = _measured(tried)
    shown = next(line for line in tried.stderr.splitlines() if "with the fix" in line)
    assert f"measured {measured['step_s'] * 1e3:.1f} ms/step with the fix ({measured['speedup']:.2f}× faster)" in shown


@pytest.mark.e2e
def test_a_tries_files_go_into_its_folder_and_the_scripts_stay_as_the_run_left_them(tried: Result) -> None:
    cwd, folder = tried.run_dir.parent, tried.run_dir / "tries" / "GD101"
    kept, moved = cwd / "model.pt", folder / "outputs" / "model.pt"
    assert kept.is_file() and moved.is_file()
    manifest = tried.manifest()
    ended = dt.datetime.fromisoformat(manifest["created"]).timestamp() + manifest["duration_s"]
    assert kept.stat().st_mtime <= ended < moved.stat().st_mtime  # the diagnosed run's file, and the try's
    assert (folder / "output.log").is_file()  # the try's output goes there, off the user's terminal
    assert len([line for line in tried.stdout.splitlines() if "mean_step_s" in line]) == 1
    assert not (tried.run_dir / "tries" / ".kept").exists()


def test_a_fix_that_breaks_the_script_is_failed_and_the_report_is_whole(gd: Gpudoctor) -> None:
    result = gd.profile(STARVED, "--steps", "30", "--crash-with-workers", options=("--try-fixes", "--try-steps", "20"))
    assert result.returncode == 0, result
    tried = _finding(result, "GD101")["tried"]
    assert tried["status"] == "failed"
    assert tried["reason"].startswith("with the fix the script exited with status 1 (without it, 0); its output is in ")
    log = Path(tried["reason"].split()[-1])
    assert "RuntimeError: this script does not run with DataLoader workers" in log.read_text()
    assert "tried, failed: with the fix the script exited with status 1" in result.stderr
    assert "tried, failed" in (result.run_dir / "report.html").read_text()


def test_try_measures_a_recorded_runs_fixes_later(gd: Gpudoctor) -> None:
    recorded = gd.profile(STARVED, "--steps", "40")
    assert "tried" not in _finding(recorded, "GD101")
    later = gd.run("try", "--yes", "run", "--finding", "GD1", "--try-steps", "30")
    assert later.returncode == 0, later
    findings = checked_findings(recorded.run_dir / "findings.json")["findings"]
    assert [f["tried"]["status"] for f in findings if f["code"] == "GD101"] == ["measured"]
    assert all("tried" not in f for f in findings if not f["code"].startswith("GD1"))


def test_try_refuses_a_directory_that_is_no_run(gd: Gpudoctor) -> None:
    (gd.cwd / "empty").mkdir()
    result = gd.run("try", "empty")
    assert result.returncode == 65
    assert result.first_message == ("gpudoctor: empty is not a run directory of gpudoctor profile: "
                                    "it has no manifest.json.")


def _with_remedy(tmp_path: Path, remedy: Remedy) -> dict:
    """start_methods.py's line, run under gpudoctor with `remedy`."""
    log = tmp_path / "output.log"
    request = ProfileRequest(script=script("start_methods.py"), module=None, args=[], out=tmp_path / "run",
                             progress=False, remedy=remedy, output_log=log)
    assert profile(request).exit_status == 0, log.read_text()
    return json.loads(log.read_text().splitlines()[-1])


@pytest.mark.e2e
def test_a_remedy_sets_the_start_method_and_threads_where_the_script_sets_its_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert _with_remedy(tmp_path, Remedy(start_method="spawn", intra_op_threads=1)) == {
        "default": "spawn", "named": "spawn", "threads": 1, "worker_threads": 1}


@pytest.mark.e2e
def test_a_remedys_threads_stay_in_the_training_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    said = _with_remedy(tmp_path, Remedy(intra_op_threads=2))
    assert (said["threads"], said["worker_threads"]) == (2, 1)  # a forked worker keeps the one thread it sets


def test_a_remedy_describes_itself_in_the_scripts_terms() -> None:
    remedy = Remedy(loader=LoaderRemedy(at="train.py:74", num_workers=6, pin_memory=True, worker_threads=1),
                    intra_op_threads=4)
    assert remedy.describe() == ("DataLoader(num_workers=6, pin_memory=True, worker_init_fn=... "
                                 "torch.set_num_threads(1)) at train.py:74; torch.set_num_threads(4) and "
                                 "OMP_NUM_THREADS=4")
    assert Remedy.from_json(remedy.to_json()) == remedy
    assert Remedy(start_method="spawn", rank=1).describe() == 'multiprocessing start method "spawn", on rank 1'


@pytest.mark.e2e
def test_diff_sets_a_resolved_findings_measured_fix_beside_the_later_runs_speedup(tried: Result) -> None:
    gd = Gpudoctor(tried.run_dir.parent)
    fixed = gd.profile(STARVED, *TWIN_ARGS, out="twin")
    assert fixed.returncode == 0, fixed
    shown = gd.run("diff", "run", "twin")
    measured = _finding(tried, "GD101")["tried"]["speedup"]
    resolved = next(line for line in shown.stdout.splitlines() if " GD101 " in line)
    assert f"its try measured {measured:.2f}x faster" in resolved, shown.stdout
    document = json.loads(gd.run("diff", "run", "twin", "--format", "json").stdout)
    assert [f["before"]["tried_speedup"] for f in document["resolved"] if f["code"] == "GD101"] == [measured]


def _tried_as_a_whole(result: Result) -> dict:
    assert result.returncode == 0, result
    gd101 = _finding(result, "GD101")
    assert gd101["ranks"] == [0, 1]
    tried = gd101["tried"]
    assert tried["status"] == "measured", tried
    assert tried["speedup"] > 1.3, tried
    folder = result.run_dir / "tries" / "GD101"
    assert sorted(p.name for p in folder.glob("rank-*")) == ["rank-0", "rank-1"]
    return tried


def test_a_job_whose_ranks_the_script_spawns_is_tried_as_a_whole(gd: Gpudoctor) -> None:
    _tried_as_a_whole(gd.profile(script("starved_ranks.py"), options=("--try-fixes",), timeout=300))


def test_a_torchrun_job_is_tried_as_a_whole_and_again_later(gd: Gpudoctor) -> None:
    torchrun = ("-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", script("starved_ranks.py"))
    profiled = gd.run("profile", "--out", "run", "--try-fixes", *torchrun, timeout=300)
    _tried_as_a_whole(profiled)
    later = gd.run("try", "--yes", "run", "--finding", "GD101", timeout=300)
    assert later.returncode == 0, later
    _tried_as_a_whole(profiled)  # findings.json written again, by `gpudoctor try`
