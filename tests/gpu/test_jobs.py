"""Jobs of every shape run to the same end under gpudoctor as plainly, on the GPU, and leave nothing running."""

from __future__ import annotations

import sys

import pytest

from conftest import checked_findings
from gpu.conftest import Suite, assert_reported, assert_within_bound, script
from gpudoctor.bundle import read_jsonl
from gpudoctor.bundle.events import EVENT_DECODER, CompileEvent

PYTHON = sys.executable
LOOP = script("loop.py")
# A window that closes within the loops' 40 steps: wait 5, warm-up 2, active 5, detail 5 (the defaults) fit too.
TORCHRUN = [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]


@pytest.mark.parametrize("loop", [
    ["--mode", "train", "--workers", "2", "--pin"],
    ["--mode", "train", "--workers", "0", "--pin"],
    ["--mode", "train", "--workers", "0"],
    ["--mode", "inference_mode", "--workers", "2", "--pin"],
    ["--mode", "no_grad", "--workers", "0", "--pin"],
    ["--mode", "train", "--steps", "3", "--pin"],  # fewer steps than the profiler window
    ["--mode", "inference_mode", "--steps", "8", "--pin"],  # the window is still open when the script ends
    ["--mode", "train", "--steps", "12"],  # the window's profiled steps end on the script's last CUDA call
    ["--mode", "train", "--bf16", "--workers", "2", "--pin"],
    ["--mode", "train", "--graphs", "--pin"],
    ["--mode", "train", "--compile", "--steps", "60"],
], ids=lambda loop: "-".join(a.lstrip("-") for a in loop))
def test_loops(suite: Suite, loop: list[str]) -> None:
    suite.compare([PYTHON, LOOP, *loop])


def test_the_steps_matrix_work_is_counted_and_set_against_the_peak(suite: Suite) -> None:
    """One detail step's products counted in the script's process (a dispatch mode: collect.flops), in the dtype
    autocast gave them, and the job ending as plainly."""
    command = [PYTHON, LOOP, "--mode", "train", "--bf16", "--workers", "0", "--steps", "40"]
    plain = suite.plain(command)
    profiled, run_dir = suite.profiled([], command)
    suite.record(plain, profiled)
    assert profiled.returncode == plain.returncode == 0, profiled.stderr
    assert profiled.lines == plain.lines
    found = checked_findings(run_dir / "findings.json")["run"]["throughput"]
    assert found is not None and found["flops"] > 0 and found["by_precision"].get("bf16", 0) > 0, found
    assert found["tflops"] > 0 and (found["utilization"] is not None or found["reason"]), found


def test_the_inference_job_that_did_not_exit(suite: Suite) -> None:
    suite.compare([PYTHON, script("mobilenet_inference.py")])


def test_max_steps(suite: Suite) -> None:
    plain = suite.plain([PYTHON, LOOP, "--steps", "20"])
    profiled, run_dir = suite.profiled(["--max-steps", "20"], [PYTHON, LOOP, "--end", "forever"])
    suite.record(plain, profiled)
    assert profiled.returncode == 0, profiled.stderr
    assert_within_bound(profiled.wall_s, plain.wall_s)
    assert_reported(run_dir)


def test_timeout(suite: Suite) -> None:
    profiled, run_dir = suite.profiled(["--timeout", "20"], [PYTHON, LOOP, "--end", "forever", "--workers", "2"])
    suite.record(None, profiled)
    assert profiled.returncode == 124, profiled.stderr
    assert profiled.wall_s < 20 + 30
    assert_reported(run_dir)


@pytest.mark.parametrize("end", ["raise", "sigterm"])
def test_a_script_that_crashes_or_is_killed(suite: Suite, end: str) -> None:
    pair = suite.compare([PYTHON, LOOP, "--end", end])
    assert pair.plain.returncode == (1 if end == "raise" else 128 + 15)
    if end == "raise":
        assert pair.plain.stderr.splitlines()[-1] in pair.profiled.stderr


def test_a_script_that_runs_out_of_gpu_memory(suite: Suite) -> None:
    """CUDA's out-of-memory error ends the script as it does plainly, and the report says where the memory was."""
    pair = suite.compare([PYTHON, LOOP, "--end", "oom"])
    raised = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "  # the figures after it differ
    assert pair.plain.returncode == 1 and pair.plain.stderr.splitlines()[-1].startswith(raised)
    assert raised in pair.profiled.stderr
    findings = checked_findings(pair.run_dir / "findings.json")["findings"]
    [oom] = [f for f in findings if f["title"].startswith("CUDA ran out of memory")]
    assert oom["code"] == "GD402" and oom["severity"] == "critical"
    evidence = {e["name"]: e["value"] for e in oom["evidence"]}
    assert evidence["allocated by tensors"] > 0 and evidence["device"] > 10, evidence  # GiB
    assert evidence["asked for"], evidence
    assert oom["location"]["file"] == LOOP, oom["location"]


def test_try_fixes_on_a_starved_loader(suite: Suite) -> None:
    command = [PYTHON, LOOP, "--steps", "60", "--workers", "0", "--sample-ms", "1"]
    plain = suite.plain(command)
    profiled, run_dir = suite.profiled(["--try-fixes"], command)
    suite.record(plain, profiled)
    assert profiled.returncode == plain.returncode == 0, profiled.stderr
    assert profiled.lines == plain.lines
    tried = list((run_dir / "tries").iterdir()) if (run_dir / "tries").is_dir() else []
    assert tried, profiled.stderr
    assert_within_bound(profiled.wall_s, plain.wall_s * (1 + len(tried)))
    assert_reported(run_dir)


def test_try_fixes_all_compiles_and_autocasts_the_model(suite: Suite) -> None:
    """The numerics tier tried on the GPU: the loop's model run through torch.compile (inductor) and under bf16
    autocast inside the user's process, each try measured, the compiled model one graph, and nothing left."""
    command = [PYTHON, LOOP, "--steps", "60", "--workers", "2", "--pin"]
    plain = suite.plain(command)
    profiled, run_dir = suite.profiled(["--try-fixes=all", "--rules", script("numerics_rules.py")], command)
    suite.record(plain, profiled)
    assert profiled.returncode == plain.returncode == 0, profiled.stderr
    assert profiled.lines == plain.lines
    assert_reported(run_dir)
    found = {f["code"]: f["tried"] for f in checked_findings(run_dir / "findings.json")["findings"]}
    for code in ("SUITE301", "SUITE302"):
        assert found[code]["status"] == "measured" and found[code]["tier"] == "numerics", found[code]
    assert found["SUITE301"]["compile_s"] > 0
    # the diagnosed run and its two tries, each bounded as one run, and the compilation inductor needs
    assert_within_bound(profiled.wall_s, plain.wall_s * 3 + found["SUITE301"]["compile_s"])
    # a finding of the loop's own with the same fix (GD301's torch.compile) may have run the one try of it first
    tried_in = run_dir / found["SUITE301"]["bundle"]
    frames = [e for e in read_jsonl(tried_in / "events.jsonl", EVENT_DECODER) if isinstance(e, CompileEvent)]
    assert frames and not [f for f in frames if "torch_dynamo_resume" in (f.function or "")], frames


def test_lightning_on_one_gpu(suite: Suite) -> None:
    suite.compare([PYTHON, script("lightning_fit.py"), "--devices", "1"])


def test_hugging_face_trainer(suite: Suite) -> None:
    suite.compare([PYTHON, script("hf_trainer.py")])


@pytest.mark.gpus(2)
def test_lightning_ddp_on_two_gpus(suite: Suite) -> None:
    pair = suite.compare([PYTHON, script("lightning_fit.py"), "--devices", "2"])
    assert (pair.run_dir / "rank-1").is_dir()


@pytest.mark.gpus(2)
def test_torchrun_inside_gpudoctor(suite: Suite) -> None:
    pair = suite.compare([*TORCHRUN, script("ddp_nccl.py")])
    assert (pair.run_dir / "rank-0").is_dir() and (pair.run_dir / "rank-1").is_dir()


@pytest.mark.gpus(2)
def test_gpudoctor_inside_torchrun(suite: Suite) -> None:
    gpudoctor = [*TORCHRUN, "-m", "gpudoctor", "profile", "--out", "run", script("ddp_nccl.py")]
    plain = suite.plain([*TORCHRUN, script("ddp_nccl.py")])
    profiled = suite._once("gpudoctor", gpudoctor, 300)
    suite.record(plain, profiled)
    assert profiled.returncode == plain.returncode == 0, profiled.stderr
    assert profiled.lines == plain.lines
    assert_within_bound(profiled.wall_s, plain.wall_s)
    assert_reported(suite.tmp_path / "gpudoctor" / "run")


@pytest.mark.gpus(2)
def test_mp_spawn(suite: Suite) -> None:
    pair = suite.compare([PYTHON, script("ddp_nccl.py"), "--spawn", "2"])
    assert (pair.run_dir / "rank-1").is_dir()
