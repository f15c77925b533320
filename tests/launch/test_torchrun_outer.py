"""`gpudoctor profile ... torchrun ...` (or `-m torch.distributed.run ...`): gpudoctor runs torchrun with itself inside,
one bundle per rank, and merges them; torchrun's agent is never instrumented. Real two-rank gloo jobs on the CPU."""

from __future__ import annotations

import json
import shutil
import socket

from conftest import RUN_TIMEOUT_S, WINDOW, Gpudoctor, script

BUNDLE_FILES = ("manifest.json", "events.jsonl", "trace.json.gz", "findings.json", "report.html")


def _rank_manifest(gd: Gpudoctor, run: str, rank: int) -> dict:
    return json.loads((gd.cwd / run / f"rank-{rank}" / "manifest.json").read_text())


def _assert_complete_ranks(gd: Gpudoctor, run: str, ranks: tuple[int, ...]) -> None:
    assert sorted(p.name for p in (gd.cwd / run).glob("rank-*")) == [f"rank-{rank}" for rank in ranks]
    for rank in ranks:
        for name in BUNDLE_FILES:
            assert (gd.cwd / run / f"rank-{rank}" / name).is_file(), (rank, name)


def _assert_merged(gd: Gpudoctor, run: str, world_size: int = 2) -> None:
    findings = json.loads((gd.cwd / run / "findings.json").read_text())
    assert findings["run"]["world_size"] == world_size
    assert len(findings["run"]["ranks"]) == world_size
    assert (gd.cwd / run / "report.html").is_file()


def test_module_form_profiles_every_rank_and_merges_them(gd: Gpudoctor) -> None:
    result = gd.run("profile", "--out", "run", *WINDOW, "--max-steps", "50", "-m", "torch.distributed.run",
                    "--standalone", "--nproc_per_node", "2", script("ddp_train.py"), "--steps", "6")
    assert result.returncode == 0, result
    for rank in (0, 1):
        assert f"ddp_train: rank {rank} of 2 did 6 steps" in result.stdout
        manifest = _rank_manifest(gd, "run", rank)
        assert manifest["exit"]["ending"] == "completed"
        assert manifest["window"]["active"] == 2 and manifest["max_steps"] == 50  # passed through to every rank
    _assert_complete_ranks(gd, "run", (0, 1))
    _assert_merged(gd, "run")
    assert "2 ranks" in result.stderr  # the merged summary, once


def test_max_steps_stops_torchruns_ranks_and_ends_their_process_groups(gd: Gpudoctor) -> None:
    # As with mp.spawn (test_frameworks.py): each rank's group is ended before its interpreter shuts down.
    result = gd.run("profile", "--out", "run", *WINDOW, "--max-steps", "5", "-m", "torch.distributed.run",
                    "--standalone", "--nproc_per_node", "2", script("ddp_train.py"), "--steps", "400",
                    "--say-group-at-shutdown")
    assert result.returncode == 0, result
    for rank in (0, 1):
        manifest = _rank_manifest(gd, "run", rank)
        assert manifest["exit"]["ending"] == "max_steps" and manifest["exit"]["steps"] == 5
        assert f"rank {rank}: process group in the script's atexit handler: held" in result.stdout, result
        assert f"rank {rank}: process group at shutdown: none, gloo threads: 0" in result.stdout, result
    _assert_complete_ranks(gd, "run", (0, 1))


def test_a_job_of_one_rank_is_merged_like_several(gd: Gpudoctor) -> None:
    # torchrun --nproc_per_node 1 (the DDP tutorials' first run): WORLD_SIZE is 1, and the rank is still torchrun's
    result = gd.run("profile", "--out", "run", *WINDOW, "-m", "torch.distributed.run", "--standalone",
                    "--nproc_per_node", "1", script("ddp_train.py"), "--steps", "6")
    assert result.returncode == 0, result
    assert "ddp_train: rank 0 of 1 did 6 steps" in result.stdout
    _assert_complete_ranks(gd, "run", (0,))
    _assert_merged(gd, "run", world_size=1)
    assert "gpudoctor: 1 rank;" in result.stderr


def test_console_script_with_torchruns_module_mode(gd: Gpudoctor) -> None:
    assert shutil.which("torchrun"), "torch installs the torchrun console script"
    shutil.copy(script("ddp_train.py"), gd.cwd)  # run as a module of the working directory: torchrun -m ddp_train
    result = gd.run("profile", *WINDOW, "torchrun", "--standalone", "--nproc-per-node", "2", "-m", "ddp_train",
                    "--steps", "6")
    assert result.returncode == 0, result
    assert "ddp_train: rank 0 of 2 did 6 steps" in result.stdout
    (run_dir,) = (gd.cwd / "gpudoctor-runs").iterdir()
    assert run_dir.name.startswith("ddp_train-torchrun-")
    run = str(run_dir.relative_to(gd.cwd))
    _assert_complete_ranks(gd, run, (0, 1))
    assert _rank_manifest(gd, run, 1)["target"] == {"script": None, "module": "ddp_train", "args": ["--steps", "6"]}
    _assert_merged(gd, run)


def test_a_failed_rank_gives_torchruns_status_and_is_named(gd: Gpudoctor) -> None:
    result = gd.run("profile", "--out", "run", *WINDOW, "-m", "torch.distributed.run", "--standalone",
                    "--nproc_per_node", "2", script("ddp_crash.py"), "--steps", "6")
    assert result.returncode == 1, result
    _assert_complete_ranks(gd, "run", (0, 1))
    assert _rank_manifest(gd, "run", 1)["exit"]["ending"] == "exception"
    (said,) = [m for m in result.messages if m.startswith("gpudoctor: torchrun exited")]
    assert said.startswith("gpudoctor: torchrun exited with status 1; rank 1 failed (status 1: ValueError: rank 1 "
                           "read a corrupt batch at step 3)"), said


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_two_nodes_each_write_their_own_ranks(gd: Gpudoctor) -> None:
    endpoint = f"127.0.0.1:{_free_port()}"
    nodes = [gd.start("profile", "--out", out, *WINDOW, "-m", "torch.distributed.run", "--nnodes", "2",
                      "--nproc_per_node", "1", "--node_rank", str(node), "--rdzv_backend", "c10d",
                      "--rdzv_endpoint", endpoint, "--rdzv_id", "outer-form-test", script("ddp_train.py"),
                      "--steps", "6")
             for node, out in enumerate(("A", "B"))]
    try:
        ended = [node.communicate(timeout=RUN_TIMEOUT_S) for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    for node, (_, stderr) in zip(nodes, ended):
        assert node.returncode == 0, stderr[-3000:]
    held = [sorted(p.name for p in (gd.cwd / out).glob("rank-*")) for out in ("A", "B")]
    assert sorted(held) == [["rank-0"], ["rank-1"]], held  # global ranks, one per node
    for out, (ranks,) in zip(("A", "B"), held):
        _assert_complete_ranks(gd, out, (int(ranks[5:]),))


def test_torchrun_that_runs_no_python_is_refused(gd: Gpudoctor) -> None:
    result = gd.run("profile", "torchrun", "--standalone", "--no-python", script("ddp_train.py"))
    assert result.returncode == 2, result
    assert not (gd.cwd / "gpudoctor-runs").exists()
    assert "torchrun's --no-python runs the script as a program" in " ".join(result.stderr.split())
