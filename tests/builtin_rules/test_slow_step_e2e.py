"""The slow-step rules the CPU can show, end to end: `gpudoctor profile` run for real on small scripts with each
pathology and their twins (tests/scripts/rules/): GD312 on Adam's per-tensor loop (silent with foreach or fused),
GD701 on a torch.save every 10 steps (silent saving once), GD702 on a short job whose set-up dominates and on a
loader that restarts its workers at every epoch (silent on the twins), GD314 on a compiled model that breaks its
graph and recompiles (dynamo on the CPU; silent on its twin); and the tiers of tries: `--try-fixes` measures the
fused optimizer and leaves bf16 autocast and compilation, `--try-fixes=all` measures them all, each with its tier
and how far the loss moved, the compilation's time apart."""

from __future__ import annotations

import os

import pytest

from builtin_rules.test_rules_cpu_e2e import (
    assert_fires,
    assert_silent,
    evidence,
    findings_of,
    line_of,
    profile,
    rule_script,
)
from conftest import Gpudoctor, Result
from gpudoctor.bundle.events import CompileEvent

pytestmark = pytest.mark.e2e

TRY_TIMEOUT_S = 240


def test_gd312_fires_on_adams_per_tensor_loop_at_the_line_that_builds_it(gd: Gpudoctor) -> None:
    script = rule_script("slow_optimizer.py")
    result = profile(gd, "slow_optimizer.py", "--impl", "loop")
    finding = assert_fires(result, "GD312", "optimizer", script, line_of(script, "OPTIMIZER"))
    facts = evidence(finding)
    assert facts["tensors"] == 96 and facts["foreach"] is False and facts["optimizer"] == "Adam"
    assert finding["remedy"]["optimizer"]["at"].endswith(f"slow_optimizer.py:{line_of(script, 'OPTIMIZER')}")
    assert "fused=True" in finding["fix"]


@pytest.mark.parametrize("impl", ["foreach", "fused"])
def test_gd312_is_silent_with_foreach_or_fused(gd: Gpudoctor, impl: str) -> None:
    assert_silent(profile(gd, "slow_optimizer.py", "--impl", impl), "GD312")


def test_gd701_fires_on_a_save_every_ten_steps_at_the_save(gd: Gpudoctor) -> None:
    script = rule_script("checkpoint_stall.py")
    finding = assert_fires(profile(gd, "checkpoint_stall.py"), "GD701", "periodic_stall", script,
                           line_of(script, "SAVE"))
    assert finding["title"].startswith("Every 10th step stalls") and "torch.save" in finding["title"]
    assert evidence(finding)["every"] == 10 and "async_save" in finding["fix"]


def test_gd701_is_silent_when_the_script_saves_once(gd: Gpudoctor) -> None:
    assert_silent(profile(gd, "checkpoint_stall.py", "--every", "0"), "GD701")


def test_gd702_tells_a_short_job_its_set_up_dominates(gd: Gpudoctor) -> None:
    script = rule_script("slow_startup.py")
    finding = assert_fires(profile(gd, "slow_startup.py", "--setup-s", "3"), "GD702", "startup", script,
                           line_of(script, "INDEXING"))
    assert finding["severity"] == "critical" and "the script's own set-up" in finding["title"]
    assert evidence(finding)["the script's own set-up"] >= 2.5
    assert finding["impact"] is None and "paid once" in finding["impact_reason"]


def test_gd702_sizes_the_workers_a_loader_restarts_at_every_epoch(gd: Gpudoctor) -> None:
    script = rule_script("slow_startup.py")
    # 64 steps: seven epochs' restarts among the steps after the window. At 40 there were three, and now and then
    # a run on a 2-core machine sized them under the 20% asserted (twice in 16 runs here; once at 16%)
    finding = assert_fires(profile(gd, "slow_startup.py", "--workers", "4", "--steps", "64"), "GD702", "startup",
                           script, line_of(script, "LOADER"))
    assert "later epochs start 4 workers again" in finding["title"]
    assert finding["impact"] > 0.2 and finding["remedy"]["loader"]["persistent_workers"] is True


def test_gd702_tells_what_one_worker_per_core_saves_of_their_start_and_a_try_times_it(gd: Gpudoctor) -> None:
    """Eight workers a core, each computing 0.1 s before its first sample: they start in turn, in about 0.8 s
    whatever the cores; one per core (less the training process's) in about 0.1 s. The try's steps are as fast;
    what it changes is the start, which the try's own run times."""
    cores = len(os.sched_getaffinity(0))
    workers = 8 * cores
    script = rule_script("slow_startup.py")
    result = profile(gd, "slow_startup.py", "--workers", str(workers), "--worker-start-cpu-s", "0.1",
                     "--epoch-steps", "100", "--steps", "40")
    finding = assert_fires(result, "GD702", "startup", script, line_of(script, "LOADER"))
    assert f"starting {workers} loader workers on {cores} cores" in finding["title"]
    facts = evidence(finding)
    start = facts["the DataLoader workers' start"]
    fewer = max(1, cores - 1)
    assert facts["one worker per core saves (est.)"] == pytest.approx(start * (1 - fewer / workers), abs=0.02)
    assert finding["remedy"]["loader"] == {"at": finding["remedy"]["loader"]["at"], "num_workers": fewer}
    tried = gd.run("try", "--yes", "run", "--finding", "GD702", timeout=TRY_TIMEOUT_S)
    assert tried.returncode == 0, tried
    [after] = findings_of(result, "GD702")  # the run's findings.json, with what the try measured
    try_of = after["tried"]
    assert try_of["status"] == "measured", try_of
    before_s, after_s = try_of["workers_start_s"]
    assert before_s == pytest.approx(start, abs=0.01) and after_s < before_s / 2  # the start, timed in the try's run
    assert f"the workers' start {before_s:.2f} → {after_s:.2f} s" in tried.stderr


@pytest.mark.parametrize("args", [(), ("--workers", "4", "--persistent")])
def test_gd702_is_silent_on_the_twins(gd: Gpudoctor, args: tuple[str, ...]) -> None:
    assert_silent(profile(gd, "slow_startup.py", *args), "GD702")


def test_gd314_names_the_graph_break_and_the_recompilation(gd: Gpudoctor) -> None:
    script = rule_script("recompiles.py")
    result = profile(gd, "recompiles.py")
    found = findings_of(result, "GD314")
    lines = {f["location"]["line"]: f for f in found}
    broken = lines[line_of(script, "BREAK")]
    assert broken["category"] == "compile" and "Tensor.item()" in broken["title"]
    assert "capture_scalar_outputs" in broken["fix"]
    again = next(f for f in found if "compiled" in f["title"] and "more time" in f["title"])
    assert "size mismatch" in again["title"] and "mark_dynamic" in again["fix"]


def test_gd314_is_silent_on_a_model_compiled_once(gd: Gpudoctor) -> None:
    assert_silent(profile(gd, "recompiles.py", "--fixed"), "GD314")


# -- the tiers of tries -------------------------------------------------------------------------------------
def tried(gd: Gpudoctor, try_option: str) -> Result:
    rules = str(rule_script("numerics_remedy.py"))
    result = gd.run("profile", "--out", "run", "--rules", rules, try_option, "--try-steps", "40",
                    "--wait-steps", "2", "--warmup-steps", "1", "--active-steps", "4",
                    str(rule_script("slow_optimizer.py")), "--impl", "loop", timeout=TRY_TIMEOUT_S)
    assert result.returncode == 0, result
    return result


def test_try_fixes_measures_the_fixes_that_keep_the_computation_and_leaves_the_others(gd: Gpudoctor) -> None:
    result = tried(gd, "--try-fixes")
    [fused] = findings_of(result, "GD312")
    assert fused["tried"]["status"] == "measured" and fused["tried"]["tier"] == "same", fused["tried"]
    assert fused["tried"]["loss_delta"] is not None and fused["tried"]["loss_delta"] < 1e-3  # the same update
    [autocast] = findings_of(result, "TIER101")
    assert autocast["tried"]["status"] == "not_applicable" and autocast["tried"]["tier"] == "numerics"
    assert "--try-fixes=all" in autocast["tried"]["reason"]


def test_try_fixes_all_measures_the_numerics_and_how_far_the_loss_moved(gd: Gpudoctor) -> None:
    result = tried(gd, "--try-fixes=all")
    [autocast] = findings_of(result, "TIER101")
    try_of = autocast["tried"]
    assert try_of["status"] == "measured" and try_of["tier"] == "numerics", try_of
    assert "autocast" in try_of["applied"]
    assert 0 < try_of["loss_delta"] < 0.2, try_of  # bf16 rounds the model's products: the loss moves, a little
    [fused] = findings_of(result, "GD312")
    assert fused["tried"]["tier"] == "same" and fused["tried"]["status"] == "measured"
    [compiled] = findings_of(result, "TIER102")
    assert compiled["tried"]["status"] == "measured" and compiled["tried"]["tier"] == "numerics", compiled["tried"]
    assert compiled["tried"]["compile_s"] > 0 and "compile" in compiled["tried"]["applied"]
    assert fused["tried"]["compile_s"] is None
    # One graph, as `model = torch.compile(model)` makes it: no frame of gpudoctor's own hooks compiled apart,
    # which breaking the model's graph at each of them would show (Module.compile in place did so).
    frames = result.events(CompileEvent, "tries/TIER102")
    assert frames and not [f for f in frames if "torch_dynamo_resume" in (f.function or "")], frames
    assert not [f for f in frames if "/gpudoctor/collect/" in (f.file or "") and f.function != "call_model"], frames
