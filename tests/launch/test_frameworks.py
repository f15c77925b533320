"""Jobs as people launch them, on the CPU: each ends under gpudoctor as it does plainly (its exit status, its own
output), and every rank it runs is profiled, in RUN/rank-K/, and merged into RUN's findings.json.

PyTorch Lightning (one process; DDP with the processes Lightning starts itself, `strategy="ddp"` and
`"ddp_spawn"`), Hugging Face's Trainer, `accelerate launch`, torch.multiprocessing.spawn, and torchrun around
gpudoctor and inside it. torch.compile has its own tests (test_compiled_models.py).
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import RUN_TIMEOUT_S, WINDOW, Gpudoctor, Result, checked_findings, env_with, script
from gpudoctor.bundle.events import LoaderEvent, ProcessEvent, RankEvent, StepEvent


def _free_port() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


# In a plain command: a port free when that run starts (a run made again gets another).
FREE_PORT = "<a free port>"
# What a torch.distributed process prints when it aborts as the interpreter shuts down: a gloo worker frees a finished
# collective whose thread-local state holds Python objects, cannot take the GIL once shutdown has begun, and its
# thread's exit aborts the process (gpudoctor/collect/session.py let_native_threads_settle). The test scripts end
# their process groups before (tests/scripts/spawn_ddp.py), but a library's group (Lightning's) can still be there.
NATIVE_ABORTS = ("terminate called without an active exception", "FATAL: exception not rethrown")


def _plain(gd: Gpudoctor, *command: str) -> subprocess.CompletedProcess[str]:
    """The command run plainly, and once more if a process of it aborted in torch.distributed's shutdown: that abort
    is torch's, outside gpudoctor, and the comparison needs a plain run that ran to its end. The second run stands,
    whatever it does."""
    done = _run_plain(gd, command)
    if any(abort in done.stderr for abort in NATIVE_ABORTS):
        sys.stderr.write(f"the plain run aborted in torch.distributed's shutdown (status {done.returncode}); "
                         "running it once more\n")
        done = _run_plain(gd, command)
    return done


def _run_plain(gd: Gpudoctor, command: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    argv = [_free_port() if part == FREE_PORT else part for part in command]
    return subprocess.run([sys.executable, *argv], cwd=gd.cwd, env=env_with(), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S)


def _own_lines(stdout: str, name: str) -> list[str]:
    """The script's own lines (`name: ...`), sorted: the ranks' interleave (a print() writes its newline apart, so
    one rank's line can run into another's), and libraries print timings of their own."""
    return sorted(part.splitlines()[0] for part in re.split(f"(?={re.escape(name)}:)", stdout)
                  if part.startswith(f"{name}:"))


def _optimizer_steps(result: Result, bundle: str = "") -> int:
    """Steps marked by the optimizer: a loader that fetches a batch ahead (Accelerate's, the Trainer's) counts one
    step before the optimizer's first, which the optimizer's steps then replace."""
    return sum(1 for e in result.events(StepEvent, bundle) if e.source == "optimizer")


def _same_as_plain(gd: Gpudoctor, name: str, plain_command: list[str], profiled: Result) -> None:
    plain = _plain(gd, *plain_command)
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert profiled.returncode == plain.returncode, profiled
    assert _own_lines(profiled.stdout, name) == _own_lines(plain.stdout, name) != [], (plain.stdout, profiled)


def _every_rank_merged(result: Result, world_size: int, steps: int) -> dict:
    findings = checked_findings(result.run_dir / "findings.json")
    assert findings["run"]["world_size"] == world_size, findings["run"]
    assert [r["rank"] for r in findings["run"]["ranks"]] == list(range(world_size))
    for rank in range(world_size):
        assert _optimizer_steps(result, f"rank-{rank}") == steps, rank
        manifest = json.loads((result.run_dir / f"rank-{rank}" / "manifest.json").read_text())
        assert manifest["exit"]["ending"] == "completed", manifest["exit"]
        assert manifest["child"]["process"]["rank"] == rank
        assert (result.run_dir / f"rank-{rank}" / "report.html").is_file()
    assert (result.run_dir / "report.html").is_file()
    return findings


def _no_rank_is_another_program(result: Result, world_size: int) -> None:
    """Each rank's host samples count the job's other ranks as the job's own demand for the CPU (`job_cpu`), never as
    other programs', and its own process samples hold none of theirs."""
    pids = {rank: result.events(ProcessEvent, f"rank-{rank}")[0].pid for rank in range(world_size)}
    for rank, pid in pids.items():
        bundle = result.run_dir / f"rank-{rank}"
        host = [json.loads(line) for line in (bundle / "samples" / "host.jsonl").read_text().splitlines()]
        procs = [json.loads(line) for line in (bundle / "samples" / "procs.jsonl").read_text().splitlines()]
        others = {str(p) for r, p in pids.items() if r != rank}
        assert any(others <= set(row.get("job_cpu", {})) for row in host), rank
        own = {entry["pid"] for row in procs for entry in row.get("procs", [])}
        assert pid in own and not own & {int(p) for p in others}, rank


def _launched_by(result: Result, launcher: str | None) -> None:
    """The job's report names what launched its ranks as it is, never "torchrun" for another."""
    assert result.findings()["run"].get("launcher") == launcher
    page = (result.run_dir / "report.html").read_text()
    assert "torchrun job" not in page
    if launcher is not None:
        assert f"ranks of one job launched by {launcher}." in page


def test_lightning_trains_in_one_process(gd: Gpudoctor) -> None:
    result = gd.profile(script("lightning_train.py"), "--steps", "12")
    _same_as_plain(gd, "lightning_train", [script("lightning_train.py"), "--steps", "12"], result)
    assert not (result.run_dir / "rank-0").exists()  # one process: the run directory is its bundle
    assert _optimizer_steps(result) == 12
    assert result.findings()["run"]["step_source"] == "optimizer"


@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn"])
def test_lightning_ddp_profiles_the_ranks_lightning_starts(gd: Gpudoctor, strategy: str) -> None:
    """"ddp": Lightning runs the script again for rank 1, and the script's own process is rank 0; "ddp_spawn": both
    ranks are torch.multiprocessing's, and the script's own process only launched them."""
    args = ("--strategy", strategy, "--devices", "2", "--steps", "12")
    result = gd.profile(script("lightning_train.py"), *args)
    _same_as_plain(gd, "lightning_train", [script("lightning_train.py"), *args], result)
    _every_rank_merged(result, 2, 12)
    _no_rank_is_another_program(result, 2)
    assert (result.run_dir / "launcher").is_dir() == (strategy == "ddp_spawn")
    _launched_by(result, "Lightning")
    joined = [e for e in result.events(RankEvent, "rank-1") if e.source == "init_process_group"]
    assert [(e.rank, e.world_size) for e in joined] == [(1, 2)]


TRAIN_DATALOADER_LINE = 29  # tests/scripts/lightning_train.py: `return DataLoader(self.data, batch_size=32)`
TRAINING_ARGUMENTS_LINE = 38  # tests/scripts/hf_trainer.py: `training = TrainingArguments(...)`


@pytest.mark.e2e
def test_a_loader_lightning_rebuilds_keeps_the_line_that_made_it(tmp_path: Path) -> None:
    """Under DDP Lightning builds the loader again with a DistributedSampler: the line to change is still the
    script's own DataLoader(...) in train_dataloader()."""
    result = Gpudoctor(tmp_path).profile(script("lightning_train.py"), "--strategy", "ddp", "--devices", "2",
                                         "--steps", "8")
    assert result.returncode == 0, result
    for rank in (0, 1):
        [loader] = result.events(LoaderEvent, f"rank-{rank}")
        assert (loader.sampler, loader.made_by) == ("DistributedSampler", "lightning")
        assert loader.site is not None and (Path(loader.site.file).name, loader.site.line) == (
            "lightning_train.py", TRAIN_DATALOADER_LINE)


def test_the_trainers_loader_is_fixed_through_its_arguments(gd: Gpudoctor) -> None:
    result = gd.profile(script("hf_trainer.py"), "--steps", "16", "--sample-ms", "4")
    assert result.returncode == 0, result
    starved = next(f for f in result.findings()["findings"] if f["code"] == "GD101")
    assert starved["fix"].startswith("TrainingArguments(dataloader_num_workers=")
    assert "dataloader_persistent_workers=True" in starved["fix"] and "the Trainer then builds DataLoader(" in starved[
        "fix"]
    # The Trainer builds the loader from its arguments: the line to change is where the script sets them.
    assert (Path(starved["location"]["file"]).name, starved["location"]["line"]) == ("hf_trainer.py",
                                                                                     TRAINING_ARGUMENTS_LINE)
    assert f"hf_trainer.py:{TRAINING_ARGUMENTS_LINE}: the Trainer then builds DataLoader(" in starved["fix"]


def test_hugging_face_trainer(gd: Gpudoctor) -> None:
    result = gd.profile(script("hf_trainer.py"), "--steps", "12")
    _same_as_plain(gd, "hf_trainer", [script("hf_trainer.py"), "--steps", "12"], result)
    assert _optimizer_steps(result) == 12
    assert result.findings()["run"]["step_source"] == "optimizer"
    [loader] = result.events(LoaderEvent)  # the Trainer passes its batch through a batch sampler
    assert (loader.batch_size, loader.made_by) == (4, "transformers")


def test_accelerate_launch_runs_each_rank_under_gpudoctor(gd: Gpudoctor) -> None:
    """`gpudoctor profile accelerate launch ...`, as typed: the program on PATH runs as its console script."""
    assert shutil.which("accelerate"), "accelerate installs the accelerate console script"
    options = ["--multi_gpu", "--num_processes", "2", "--main_process_port"]
    args = [script("accelerate_train.py"), "--steps", "12"]
    result = gd.run("profile", "--out", "run", *WINDOW, "accelerate", "launch", *options, _free_port(), *args)
    _same_as_plain(gd, "accelerate_train", ["-m", "accelerate.commands.launch", *options, FREE_PORT, *args], result)
    _every_rank_merged(result, 2, 12)
    _no_rank_is_another_program(result, 2)
    _launched_by(result, "accelerate")


def test_torch_multiprocessing_spawn(gd: Gpudoctor) -> None:
    result = gd.profile(script("spawn_ddp.py"), "--steps", "12")
    _same_as_plain(gd, "spawn_ddp", [script("spawn_ddp.py"), "--steps", "12"], result)
    _every_rank_merged(result, 2, 12)
    _no_rank_is_another_program(result, 2)
    _launched_by(result, "mp.spawn")


def test_subprocesses_that_run_ranks(gd: Gpudoctor) -> None:
    """A launcher of the script's own starts each rank as `python script.py` with RANK set."""
    result = gd.profile(script("subprocess_ranks.py"), "--steps", "12")
    _same_as_plain(gd, "subprocess_ranks", [script("subprocess_ranks.py"), "--steps", "12"], result)
    _every_rank_merged(result, 2, 12)
    _no_rank_is_another_program(result, 2)
    assert (result.run_dir / "launcher" / "manifest.json").is_file()
    _launched_by(result, None)  # the script's own launcher: named by no framework


def test_max_steps_stops_every_rank_and_ends_its_process_group(gd: Gpudoctor) -> None:
    # Stopped inside its step, a rank never reaches its script's destroy_process_group(): gpudoctor ends the group,
    # after the script's own atexit handlers (registered as its module is imported, before the rank starts) and
    # before the interpreter shuts down, where ending it can abort the process (spawn_ddp.py). Before, each rank
    # said "held, gloo threads: 3" at shutdown.
    result = gd.run("profile", "--out", "run", *WINDOW, "--max-steps", "8", script("spawn_ddp.py"), "--steps", "400",
                    "--say-group-at-shutdown")
    assert result.returncode == 0, result
    for rank in (0, 1):
        manifest = json.loads((result.run_dir / f"rank-{rank}" / "manifest.json").read_text())
        assert manifest["exit"]["ending"] == "max_steps" and manifest["exit"]["steps"] == 8
        assert f"rank {rank}: process group in the script's atexit handler: held" in result.stdout, result
        assert f"rank {rank}: process group at shutdown: none, gloo threads: 0" in result.stdout, result


def test_timeout_stops_every_rank(gd: Gpudoctor) -> None:
    # Time for both ranks to start and write their window's trace on two loaded cores: 12 s was not (the ranks had
    # not stepped when it ended them), and the whole of an 8-step run took 24 s there.
    result = gd.run("profile", "--out", "run", *WINDOW, "--timeout", "30", script("spawn_ddp.py"), "--steps",
                    "1000000")
    assert result.returncode == 124, result
    for rank in (0, 1):
        manifest = json.loads((result.run_dir / f"rank-{rank}" / "manifest.json").read_text())
        assert manifest["exit"] is None or manifest["exit"]["ending"] != "completed", manifest["exit"]
        assert (result.run_dir / f"rank-{rank}" / "trace.json.gz").is_file()
    assert checked_findings(result.run_dir / "findings.json")["run"]["world_size"] == 2


def test_a_crashing_rank_is_named_and_the_others_bundles_are_kept(gd: Gpudoctor) -> None:
    result = gd.run("profile", "--out", "run", *WINDOW, script("spawn_ddp.py"), "--steps", "12", "--crash-rank", "1")
    plain = _plain(gd, script("spawn_ddp.py"), "--steps", "12", "--crash-rank", "1")
    assert result.returncode == plain.returncode == 1, (plain.stderr[-2000:], result)
    crashed = json.loads((result.run_dir / "rank-1" / "manifest.json").read_text())["exit"]
    assert crashed["ending"] == "exception" and crashed["exception"]["exception"] == "RuntimeError"
    assert (result.run_dir / "rank-0" / "manifest.json").is_file()
    verdict = checked_findings(result.run_dir / "findings.json")["summary"]["verdict"]
    assert verdict.startswith("Rank 1 raised RuntimeError: rank 1 crashed on purpose."), verdict


@pytest.mark.parametrize("form", ["outer", "inner"])
def test_torchrun_either_way_round(gd: Gpudoctor, form: str) -> None:
    torchrun = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    args = [script("ddp_train.py"), "--steps", "12"]
    if form == "outer":
        result = gd.run("profile", "--out", "run", *WINDOW, *torchrun, *args)
    else:
        inner = subprocess.run([sys.executable, *torchrun, "-m", "gpudoctor", "profile", "--out", "run", *WINDOW,
                                *args], cwd=gd.cwd, env=env_with(), capture_output=True, text=True,
                               timeout=RUN_TIMEOUT_S)
        result = Result(inner.returncode, inner.stdout, inner.stderr, gd.cwd / "run")
    _same_as_plain(gd, "ddp_train", [*torchrun, *args], result)
    _every_rank_merged(result, 2, 12)
    assert len(re.findall(r"^gpudoctor: 2 ranks;", result.stderr, re.MULTILINE)) == 1
    _launched_by(result, "torchrun")


def test_a_killed_gpudoctor_leaves_no_process_of_the_job(gd: Gpudoctor) -> None:
    import psutil

    process = gd.start("profile", "--out", "run", *WINDOW, script("spawn_ddp.py"), "--steps", "100000")
    try:
        job = _wait_for_ranks(gd.cwd / "run", process)
        process.kill()
        process.wait(timeout=30)
        _, alive = psutil.wait_procs(job, timeout=60)
        assert not alive, [p.pid for p in alive]
    finally:
        for leftover in psutil.Process().children(recursive=True):
            leftover.kill()


def _wait_for_ranks(run_dir: Path, process: subprocess.Popen) -> list:
    """The job's processes once both ranks have stepped: the script's own and its ranks."""
    import time

    import psutil

    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline:
        stepped = [run_dir / f"rank-{rank}" / "events.jsonl" for rank in (0, 1)]
        if all(path.is_file() and '"kind":"step"' in path.read_text() for path in stepped):
            return psutil.Process(process.pid).children(recursive=True)
        assert process.poll() is None, process.communicate()
        time.sleep(0.2)
    raise AssertionError("the ranks never stepped")
