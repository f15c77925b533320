"""A try's fix holds where frameworks build the DataLoader again (Accelerate's prepare_data_loader, Hugging Face's
Trainer from its TrainingArguments), and a fix that a script undoes on a rank after DataLoader(...) makes the try
`failed`, with the sentence that says where; a torchrun straggler's try says what it changed on each rank and how
it differs from what the prediction assumes."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import Gpudoctor, Result, script
from gpudoctor.bundle.events import LoaderEvent, RemedyEvent
from gpudoctor.launch.profile import ProfileRequest, profile
from gpudoctor.remedy import LoaderRemedy, Remedy

pytestmark = pytest.mark.e2e

STRAGGLER = script("ddp_loader_straggler.py")
TORCHRUN = ("-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2")
TIMEOUT_S = 400


def _finding(result: Result, code: str) -> dict:
    return next(f for f in result.findings()["findings"] if f["code"] == code)


def _line_of(path: str, text: str) -> int:
    return next(n for n, line in enumerate(Path(path).read_text().splitlines(), 1) if text in line)


def test_a_fix_holds_on_the_loader_accelerate_prepares(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    train = script("accelerate_train.py")
    remedy = Remedy(loader=LoaderRemedy(at=f"{train}:{_line_of(train, 'loader = DataLoader(')}", num_workers=2,
                                        persistent_workers=True))
    request = ProfileRequest(script=train, module=None, args=["--steps", "8"], out=tmp_path / "run", progress=False,
                             remedy=remedy, output_log=tmp_path / "output.log")
    assert profile(request).exit_status == 0, (tmp_path / "output.log").read_text()
    run = Result(0, "", "", tmp_path / "run")
    [loader] = run.events(LoaderEvent)
    assert (loader.made_by, loader.num_workers, loader.persistent_workers) == ("accelerate", 2, True)
    assert [e.applied for e in run.events(RemedyEvent)] == [
        f"DataLoader(num_workers=2, persistent_workers=True) at {remedy.loader.at}"]  # type: ignore[union-attr]


def test_a_fix_holds_on_the_loader_the_trainer_builds(gd: Gpudoctor) -> None:
    result = gd.profile(script("hf_trainer.py"), "--steps", "40", "--sample-ms", "4", options=("--try-fixes",),
                        timeout=TIMEOUT_S)
    assert result.returncode == 0, result
    tried = _finding(result, "GD101")["tried"]
    assert tried["status"] == "measured", tried
    workers = _finding(result, "GD101")["remedy"]["loader"]["num_workers"]
    assert {"rank": None, "setting": "num_workers", "before": 0, "after": workers} in tried["changes"]
    [loader] = Result(0, "", "", result.run_dir / "tries" / "GD101").events(LoaderEvent)
    assert (loader.made_by, loader.num_workers) == ("transformers", workers)  # as Accelerate prepared the Trainer's


def test_a_torchrun_stragglers_try_says_what_it_changed_on_each_rank(gd: Gpudoctor) -> None:
    result = gd.run("profile", "--out", "run", "--try-fixes", *TORCHRUN, STRAGGLER, "--steps", "40",
                    timeout=TIMEOUT_S)
    assert result.returncode == 0, result
    loader = _finding(result, "GD101")
    n = loader["remedy"]["loader"]["num_workers"]
    assert loader["tried"]["status"] == "measured", loader["tried"]
    # rank 0 ran 2 workers: where the cores give the same N (2 cores), its num_workers is left as it was
    rank0 = "persistent_workers False → True" if n == 2 else f"num_workers 2 → {n}, persistent_workers False → True"
    rank1 = f"num_workers 0 → {n}, persistent_workers False → True" if n == 2 else f"0 → {n}, False → True"
    assert loader["tried"]["applied"] == f"rank 0: {rank0}; rank 1: {rank1}"
    straggler = _finding(result, "GD601")["tried"]
    assert (straggler["fix_of"], straggler["step_s"]) == ("GD101", loader["tried"]["step_s"])
    assert "changes rank 1 alone, rank 0 as it ran" in straggler["not_as_predicted"]
    assert f"the try changed rank 0 too ({rank0})" in straggler["not_as_predicted"]


def test_a_fix_the_script_undoes_on_a_rank_is_a_failed_try(gd: Gpudoctor) -> None:
    result = gd.run("profile", "--out", "run", "--try-fixes", *TORCHRUN, STRAGGLER, "--steps", "40",
                    "--workers-off-after", timeout=TIMEOUT_S)
    assert result.returncode == 0, result
    line = _line_of(STRAGGLER, "loader = DataLoader(")
    sentence = f"not in effect on rank 1: its DataLoader at {STRAGGLER}:{line} ran with num_workers=0"
    tried = _finding(result, "GD101")["tried"]
    assert (tried["status"], tried["reason"], tried["step_s"]) == ("failed", sentence, None)
    assert _finding(result, "GD601")["tried"] == {**tried, "fix_of": "GD101"}
    assert f"      tried, failed: {sentence}" in result.stderr.splitlines()
    verdict = result.findings()["summary"]["verdict"]
    assert not verdict.startswith("Tried"), verdict  # a failed try leads nothing
