"""The slow-step rules on bundles built in code, each with a bad and a good case: GD312 (the optimizer's per-tensor
loop), GD313 (fusible work not compiled), GD314 (graph breaks and recompilations), GD402 (allocator retries, and
running out of memory), GD701 (periodic stalls), GD702 (start-up); and the one claim per ms they share with GD301.
Their GPU fixtures are in fixtures/bundles/ (tests/builtin_rules/test_rules_fixtures.py); the CPU shows GD312,
GD314, GD701 and GD702 for real (tests/builtin_rules/test_slow_step_e2e.py)."""

from __future__ import annotations

import pytest

from gpudoctor.bundle.events import (
    CompileEvent,
    CudaMemory,
    HostLine,
    LoaderStartEvent,
    OomEvent,
    OptimizerEvent,
    PauseEvent,
    StartupEvent,
    StartupLinesEvent,
)
from gpudoctor.bundle.records import Site
from gpudoctor.engine import builtin_rules, run_rules
from gpudoctor.remedy import Remedy
from gpudoctor.testing import BundleBuilder, assert_fires, assert_not_evaluated, assert_silent, run_rule
from gpudoctor.testing.spec import DEFAULT_START

GiB = 1024 ** 3
ELEMENTWISE = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>"


def rules(*codes: str) -> list:
    return [r for r in builtin_rules() if r.code in codes]


# -- GD312 optimizer-per-tensor-loop ------------------------------------------------------------------------
def adam(**fields: object) -> OptimizerEvent:
    settings: dict[str, object] = {"name": "Adam", "module": "torch.optim.adam", "tensors": 192, "foreach": False,
                                   "takes_foreach": True, "takes_fused": True, "devices": ["cuda"], "per_tensor": True,
                                   "site": Site(file="train.py", line=30, function="main")}
    return OptimizerEvent(**(settings | fields))  # type: ignore[arg-type]


def optimizer_run(tmp_path, optimizer: OptimizerEvent | None, *, kernels: int = 1, kernel_name: str = "sgemm"):
    """Steps of 10 ms whose host spends 6 ms in optimizer.step(), the GPU busy 3 ms."""
    b = BundleBuilder(tmp_path, window=(2, 1, None))
    b.steps(12, wall_s=0.01, optimizer_s=0.006, gpu_busy_s=0.003, kernels=kernels, kernel_name=kernel_name)
    if optimizer is not None:
        b.event(optimizer)
    return b.build()


def test_gd312_fires_on_a_per_tensor_loop_and_builds_the_fused_optimizer(tmp_path) -> None:
    [finding] = assert_fires("GD312", optimizer_run(tmp_path, adam()), location="train.py:30")
    assert finding["impact"] == pytest.approx(0.54, abs=0.01)  # 6 ms of 10, 10x shorter fused
    assert finding["remedy"] == {"optimizer": {"at": "train.py:30"}}  # fused: the default implementation
    assert "Adam(..., fused=True) at train.py:30" in finding["fix"]
    assert finding["category"] == "optimizer"


@pytest.mark.parametrize("settings", [{"foreach": True, "per_tensor": False}, {"fused": True, "per_tensor": False},
                                      {"tensors": 8}])
def test_gd312_is_silent_with_foreach_fused_or_few_tensors(tmp_path, settings: dict[str, object]) -> None:
    assert_silent("GD312", optimizer_run(tmp_path, adam(**settings)))


def test_gd312_gives_foreach_where_torch_has_no_fused_kernel_for_the_device(tmp_path) -> None:
    run = optimizer_run(tmp_path, adam(name="RMSprop", devices=["mps"]))
    [finding] = assert_fires("GD312", run)
    assert finding["remedy"] == {"optimizer": {"at": "train.py:30", "implementation": "foreach"}}


def test_gd312_is_not_evaluated_without_an_optimizer(tmp_path) -> None:
    assert_not_evaluated("GD312", optimizer_run(tmp_path, None), "optimizer")


def test_the_optimizer_keeps_its_ms_and_the_launch_bound_finding_the_rest(tmp_path) -> None:
    """One claim per ms: GD301 claims the GPU's idle between launches, of which the optimizer's loop is a part."""
    run = optimizer_run(tmp_path, adam(), kernels=300)  # 300 kernels of 10 µs: launch-bound
    findings = {f.code: f for f in run_rules(run, rules("GD301", "GD312")).findings}
    idle = run.budget.share_of("small_batch")
    assert findings["GD312"].impact == pytest.approx(0.54, abs=0.01)
    assert findings["GD301"].impact == pytest.approx(idle - 0.54, abs=0.01)


def test_on_a_run_without_gpu_activity_the_optimizer_is_its_share_of_the_step_and_claims_the_hosts_work(
        tmp_path) -> None:
    """The step is the main thread's own work, which a fused optimizer shrinks: GD312 keeps its saving out of that
    work, and sizes the loop by its share of the detail steps (their hooks slow the whole step alike), at the pace."""
    b = BundleBuilder(tmp_path, window=(2, 1, 4))
    b.steps(3, wall_s=0.01)
    b.steps(4, wall_s=0.02, optimizer_s=0.006)  # the detail steps: 30% in optimizer.step()
    b.steps(20, wall_s=0.01)  # the pace, outside the window
    b.process(1.0)  # the main thread computes the whole step: nothing of it is a wait
    b.event(adam(devices=["cpu"]))
    run = b.build()
    assert run.budget is None  # no GPU activity
    [finding] = run_rules(run, rules("GD312")).findings
    assert finding.impact == pytest.approx(0.3 * 0.9, abs=0.01)  # 3 ms of the 10 ms step, 10x shorter fused
    assert "3.0 ms of each 10.0 ms step" in finding.title


# -- GD313 fusible-work-not-compiled ------------------------------------------------------------------------
def eager_run(tmp_path, kernel_name: str = ELEMENTWISE, module: str = "Model"):
    """Launch-bound steps of 5 ms: 100 kernels of 2 µs each."""
    b = BundleBuilder(tmp_path, window=(2, 1, None))
    b.steps(10, wall_s=0.005, gpu_busy_s=0.0002, kernels=100, kernel_name=kernel_name)
    b.forward_site(module, site=("train.py", 50, "main"))
    return b.build()


def test_gd313_fires_on_launch_bound_elementwise_kernels_and_compiles_the_model(tmp_path) -> None:
    run = eager_run(tmp_path)
    [finding] = assert_fires("GD313", run, location="train.py:50")
    # every kernel fusible, one after another, no reduction among them: one kernel, and all the launches' idle
    assert finding["impact"] == pytest.approx(run.budget.share_of("compile"), abs=0.01)
    assert finding["remedy"] == {"compile": "inductor"}
    assert "torch.compile(model)" in finding["fix"]


def test_gd313_is_silent_on_matrix_products_and_on_a_compiled_model(tmp_path) -> None:
    assert_silent("GD313", eager_run(tmp_path / "gemm", "volta_sgemm_128x64_nn"))
    assert_silent("GD313", eager_run(tmp_path / "compiled", module="OptimizedModule"))


def test_gd313_and_gd301_make_one_claim_for_compiling_the_model(tmp_path) -> None:
    """Both findings' fix is torch.compile, of the same launch-bound idle: GD313 sizes what compiling saves, and
    GD301 counts nothing more (elementwise_eager_bad once said 80% + 12% against a twin's 80%)."""
    run = eager_run(tmp_path)
    findings = {f.code: f for f in run_rules(run, rules("GD301", "GD313")).findings}
    assert findings["GD313"].impact == pytest.approx(run.budget.share_of("compile"), abs=0.01)
    assert findings["GD301"].remedy == findings["GD313"].remedy == Remedy(compile="inductor")
    assert findings["GD301"].impact is None
    assert findings["GD301"].impact_reason == "counted in GD313's finding: the same fix"
    alone = {f.code: f for f in run_rules(run, rules("GD301")).findings}
    assert alone["GD301"].impact == pytest.approx(run.budget.share_of("small_batch"), abs=0.01)


def test_gd301_gives_no_saving_where_the_step_is_compiled_already(tmp_path) -> None:
    """Compiled, the launch-bound idle holds the Python around the compiled code, which no capture of launches
    removes: elementwise_compiled_fixed's 97% once read as a 38× promise."""
    for name, run in (("module", eager_run(tmp_path / "module", module="OptimizedModule")),
                      ("triton", eager_run(tmp_path / "triton", kernel_name="triton_poi_fused_add_0"))):
        [finding] = run_rules(run, rules("GD301")).findings
        assert finding.impact is None and finding.remedy is None, name
        assert "compiled or replays CUDA graphs already" in (finding.impact_reason or ""), name
        assert 'mode="reduce-overhead"' in finding.fix, name


# -- GD314 graph-breaks-and-recompiles ----------------------------------------------------------------------
BREAK = ("Unsupported Tensor.item() call with capture_scalar_outputs=False\n  Explanation: Dynamo does not support "
         "tracing `Tensor.item()`.")


def compiled_run(tmp_path, *compiled: CompileEvent):
    b = BundleBuilder(tmp_path, window=(2, 1, 4))
    b.steps(20, wall_s=0.01)
    b.forward_site("OptimizedModule", site=("train.py", 50, "main"))
    b.event(*compiled)
    return b.build()


def test_gd314_names_each_graph_break_and_each_recompiled_function(tmp_path) -> None:
    run = compiled_run(
        tmp_path,
        CompileEvent(step=0, compile_id="0/0", function="forward", file="model.py", line=20, seconds=2.0,
                     restart_reasons=[BREAK]),
        CompileEvent(step=0, compile_id="1/0", function="torch_dynamo_resume_in_forward_at_27", file="model.py",
                     line=27, seconds=0.3),
        CompileEvent(step=10, compile_id="0/1", function="forward", file="model.py", line=20, seconds=0.05,
                     recompile_reason="0/0: tensor 'tokens' size mismatch at index 1. expected 96, actual 128"))
    findings = {f["location"]["line"]: f for f in run_rule("GD314", run)}
    broken, again = findings[27], findings[20]
    assert broken["title"].startswith("The compiled code breaks its graph in forward(): Unsupported Tensor.item()")
    assert broken["impact"] is None and "capture_scalar_outputs" in broken["fix"]
    assert again["title"] == ("forward was compiled 1 more time: tensor 'tokens' size mismatch at index 1. "
                              "expected 96, actual 128")
    assert again["impact"] == pytest.approx(0.05 / 0.18, abs=0.01)  # 50 ms of the 18 steps after start-up
    assert "mark_dynamic" in again["fix"]


def _breaking_run(tmp_path, hooked_sync: bool, breaks: tuple[int, ...] = (27,)):
    """10 ms steps: 4 ms of kernels, then the host waits for the GPU (the break's `.item()`), then 6 ms of GPU idle
    till the next launch; with `hooked_sync`, the script's own `.item()` at train.py:58 was recorded too."""
    b = BundleBuilder(tmp_path)
    for step in b.steps(5, wall_s=0.010):
        b.kernels([(step, 0.0, 0.004)])
        b.cuda_call("cudaStreamSynchronize", step=step, at=0.0039, dur=0.0002)
    if hooked_sync:
        b.sync("item", host_s=0.003, site=("train.py", 58, "train_step"))
    b.forward_site("OptimizedModule", site=("train.py", 50, "main"))
    b.event(CompileEvent(step=0, compile_id="0/0", function="forward", file="model.py", line=20, seconds=2.0,
                         restart_reasons=[BREAK]),
            *(CompileEvent(step=0, compile_id=f"{n}/0", function=f"torch_dynamo_resume_in_forward_at_{line}",
                           file="model.py", line=line, seconds=0.3) for n, line in enumerate(breaks, start=1)))
    return b.build()


def test_gd314_sizes_a_break_that_reads_a_value_by_the_waits_no_hook_saw(tmp_path) -> None:
    """recompiles_bad (H200): no synchronizing call recorded, 7.8% of the step in the budget's sync slice, the twin
    without the break 9% faster."""
    run = _breaking_run(tmp_path / "alone", hooked_sync=False)
    assert run.budget is not None
    waits = next(s.share for s in run.budget.slices if s.name == "sync")
    assert waits > 0.3
    [broken] = [f for f in run_rule("GD314", run) if f["location"]["line"] == 27]
    assert broken["impact"] == pytest.approx(waits, abs=1e-3) and broken["impact_reason"] is None
    beside = _breaking_run(tmp_path / "beside", hooked_sync=True)  # GD211 sizes the waits then: not counted twice
    [broken] = [f for f in run_rule("GD314", beside) if f["location"]["line"] == 27]
    assert broken["impact"] is None and "not predicted" in broken["impact_reason"]
    two = _breaking_run(tmp_path / "two", hooked_sync=False, breaks=(27, 31))  # two reads share the waits
    assert [f["impact"] for f in run_rule("GD314", two)] == pytest.approx([waits / 2, waits / 2], abs=1e-3)


def test_gd314_is_silent_on_a_model_compiled_once(tmp_path) -> None:
    run = compiled_run(tmp_path, CompileEvent(step=0, function="forward", file="model.py", line=20, seconds=2.0))
    assert_silent("GD314", run)


# -- GD402 allocator-retries --------------------------------------------------------------------------------
def memory_run(tmp_path, retries_each_step: int, mallocs_each_step: int):
    b = BundleBuilder(tmp_path, window=(2, 1, 6))
    for i in range(12):
        b.step(wall_s=0.02, gpu_busy_s=0.015, cuda_memory={
            "allocated": 30 * GiB, "reserved": 70 * GiB, "max_allocated": 60 * GiB, "max_reserved": 75 * GiB,
            "alloc_retries": i * retries_each_step, "device_allocs": 100 + i * mallocs_each_step,
            "device_frees": 10 + i * mallocs_each_step, "ooms": 0, "inactive_split": 12 * GiB})
    b.forward_site(site=("train.py", 50, "main"))
    return b.build()


def test_gd402_fires_on_allocator_retries_and_tries_expandable_segments(tmp_path) -> None:
    [finding] = assert_fires("GD402", memory_run(tmp_path, 1, 2), location="train.py:50")
    assert finding["title"].startswith("The CUDA allocator frees its cache and retries 1.0 times a step")
    assert finding["remedy"] == {"alloc_conf": "expandable_segments:True"}
    # the gain is never predicted (allocator_retries_bad's recordings): --try-fixes measures it
    assert finding["severity"] == "warning"  # a retry every step
    assert finding["impact"] is None and "--try-fixes" in finding["impact_reason"] and "--try-fixes" in finding["fix"]
    evidence = {row["name"]: row["value"] for row in finding["evidence"]}
    assert evidence["free inside split blocks"] == 12 and evidence["reserved"] == 70


def test_gd402_notes_retries_rarer_than_one_a_step(tmp_path) -> None:
    """allocator_retries_bad retried once in five profiled steps, and its twin under expandable segments ran as
    fast: the memory is nearly full, the step no slower."""
    b = BundleBuilder(tmp_path, window=(2, 1, 6))
    for i in range(12):
        b.step(wall_s=0.02, gpu_busy_s=0.015, cuda_memory={
            "allocated": 30 * GiB, "reserved": 70 * GiB, "max_allocated": 60 * GiB, "max_reserved": 75 * GiB,
            "alloc_retries": 2 + (i >= 5), "device_allocs": 100, "device_frees": 10, "ooms": 0,
            "inactive_split": 1 * GiB})
    [finding] = assert_fires("GD402", b.build(), severity="info")
    assert finding["impact"] is None and "nearly full" in finding["fix"]


def test_gd402_is_silent_once_the_cache_holds_what_the_steps_need(tmp_path) -> None:
    assert_silent("GD402", memory_run(tmp_path, 0, 0))


def test_gd402_is_not_evaluated_without_the_allocators_counters(tmp_path) -> None:
    b = BundleBuilder(tmp_path, window=(2, 1, 6))
    b.steps(12, wall_s=0.02, gpu_busy_s=0.015, cuda_memory={"allocated": GiB, "reserved": GiB, "max_allocated": GiB})
    assert_not_evaluated("GD402", b.build(), "counters")


def test_gd402_says_where_the_memory_was_when_cuda_ran_out(tmp_path) -> None:
    b = BundleBuilder(tmp_path, window=(2, 1, 2))
    b.steps(6, wall_s=0.02, gpu_busy_s=0.015)
    b.exit("exception", 1, exception="torch.OutOfMemoryError", message="CUDA out of memory. Tried to allocate "
           "2.00 GiB.", where=("train.py", 61, "main"))
    b.event(OomEvent(memory=CudaMemory(allocated=60 * GiB, reserved=76 * GiB, max_allocated=70 * GiB,
                                       inactive_split=14 * GiB), free=1 * GiB, total=80 * GiB, requested="2.00 GiB"))
    [finding] = assert_fires("GD402", b.build(), location="train.py:61", severity="critical")
    evidence = {row["name"]: row["value"] for row in finding["evidence"]}
    assert evidence["cached, unused"] == 16 and evidence["held outside this process's cache"] == 3
    assert finding["fix"].startswith("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")


# -- GD701 periodic-stall -----------------------------------------------------------------------------------
def stalling_run(tmp_path, pauses: bool = True, every: int = 10):
    """40 steps of 10 ms after a window of (2, 1, 2); every `every`th one 200 ms, with a torch.save of 190 ms."""
    b = BundleBuilder(tmp_path, window=(2, 1, 2))
    for i in range(40):
        stalls = i % every == every - 1
        b.step(wall_s=0.2 if stalls else 0.01)
        if stalls and pauses:
            b.event(PauseEvent(cause="save", step=i, seconds=0.19, site=Site(file="train.py", line=60,
                                                                             function="main")))
    return b.build()


def test_gd701_fires_on_a_save_every_ten_steps_at_its_line(tmp_path) -> None:
    run = stalling_run(tmp_path)
    [finding] = assert_fires("GD701", run, location="train.py:60")
    assert finding["title"].startswith("Every 10th step stalls 190 ms in torch.save:")
    steady = [s for s in run.step_view.steady_steps if s.window not in ("warmup", "active")]
    assert finding["impact"] == pytest.approx(4 * 0.19 / (sum(s.wall_s for s in steady) - 0.01), abs=0.02)
    assert "async_save" in finding["fix"]


def test_gd701_names_a_periodic_stall_it_cannot_explain_without_a_line(tmp_path) -> None:
    [finding] = assert_fires("GD701", stalling_run(tmp_path, pauses=False, every=8), location=None)
    assert "a cause gpudoctor does not watch" in finding["title"]


def test_gd701_is_silent_without_stalls(tmp_path) -> None:
    b = BundleBuilder(tmp_path, window=(2, 1, 2))
    b.steps(40, wall_s=lambda i: 0.01 + 0.002 * (i % 3))
    assert_silent("GD701", b.build())


# -- GD702 slow-startup -------------------------------------------------------------------------------------
def starting_run(tmp_path, *, restarts: bool = False, indexing_s: float = 6.0):
    """A job launched `indexing_s` seconds before its first step; 30 steps of 10 ms, in epochs of 10 steps."""
    b = BundleBuilder(tmp_path, window=(2, 1, 2), start=DEFAULT_START + indexing_s)
    b.loader(num_workers=8, site=("train.py", 40, "main"))
    for i in range(30):
        b.step(wall_s=0.6 if restarts and i in (10, 20) else 0.01, data_wait_s=0.5 if restarts and i in (10, 20)
               else 0.0)
    b.event(StartupEvent(phase="torch_import", seconds=1.0),
            StartupLinesEvent(samples=100, interval_s=0.05, importing=10,
                              lines=[HostLine(file="train.py", line=12, function="index_dataset", samples=80)]))
    if restarts:
        b.event(*(LoaderStartEvent(loader_id=0, step=i, seconds=0.05, workers=8) for i in (0, 10, 20)))
    return b.build()


def test_gd702_tells_a_short_job_its_set_up_dominates_and_where(tmp_path) -> None:
    [finding] = assert_fires("GD702", starting_run(tmp_path), location="train.py:12", severity="critical")
    assert finding["title"].startswith("Start-up takes 9")  # of a job of ~6.3 s
    assert finding["impact"] is None and "paid once" in finding["impact_reason"]
    assert "cache its result on disk" in finding["fix"]


def test_gd702_sizes_the_workers_started_at_each_epoch_and_tries_persistent_workers(tmp_path) -> None:
    run = starting_run(tmp_path, restarts=True, indexing_s=1.0)
    [finding] = assert_fires("GD702", run, location="train.py:40")
    assert "2 later epochs start 8 workers again" in finding["title"]
    assert finding["remedy"]["loader"]["persistent_workers"] is True
    # each restarting step 590 ms over the usual 10 ms: the old workers shut down, the new ones started and awaited
    assert finding["impact"] == pytest.approx(2 * 0.59 / sum(s.wall_s for s in run.step_view.steady_steps), abs=0.01)


def workers_starting_run(tmp_path, workers: int, start_s: float):
    """A job of 40 steps of 10 ms on 16 cores whose loader's `workers` start in `start_s` before the first step,
    after 5 s of imports (fixed costs)."""
    b = BundleBuilder(tmp_path, window=(2, 1, 2), start=DEFAULT_START + 5.0 + start_s)
    b.env(cores=16)
    b.loader(num_workers=workers, site=("train.py", 40, "main"))
    b.steps(40, wall_s=0.01)
    b.event(StartupEvent(phase="torch_import", seconds=5.0), LoaderStartEvent(loader_id=0, step=0, seconds=start_s,
                                                                             workers=workers))
    return b.build()


def test_gd702_tells_what_one_worker_per_core_saves_of_their_start(tmp_path) -> None:
    """128 workers on 16 cores start in turn: 15 (one per core but the training process's) start in 15/128 of
    the time. Paid once, it is no saving of each step: given in seconds and as shares."""
    run = workers_starting_run(tmp_path, 128, 1.6)
    [finding] = assert_fires("GD702", run, location="train.py:40")
    start = run.job_time.startup.phases["loader_workers"]  # the start-up's phases, scaled to its length
    assert start > 0.9 and f"{start:.1f} s of it starting 128 loader workers on 16 cores" in finding["title"]
    evidence = {e["name"]: e["value"] for e in finding["evidence"]}
    assert evidence["one worker per core saves (est.)"] == pytest.approx(start * (1 - 15 / 128), abs=0.01)
    assert evidence["of the workers' starts (est.)"] == 88
    assert finding["impact"] is None and "paid once" in finding["impact_reason"]
    assert "num_workers=15" in finding["fix"] and "persistent_workers" not in finding["fix"]


def test_gd702_is_silent_on_as_many_workers_as_cores_or_a_start_too_short_to_matter(tmp_path) -> None:
    assert_silent("GD702", workers_starting_run(tmp_path / "cores", 16, 0.3))
    assert_silent("GD702", workers_starting_run(tmp_path / "short", 32, 0.1))  # 0.05 s of a 5.1 s job


def test_gd702_is_silent_when_the_fixed_costs_are_all_there_is(tmp_path) -> None:
    assert_silent("GD702", starting_run(tmp_path, indexing_s=0.05))


def test_gd702_is_not_evaluated_on_a_bundle_that_did_not_watch_the_start_up(tmp_path) -> None:
    b = BundleBuilder(tmp_path, window=(2, 1, 2))
    b.steps(10, wall_s=0.01)
    assert_not_evaluated("GD702", b.build(), "not watched")


# -- the time of stalls and of worker starts, claimed once --------------------------------------------------
def restarting_launch_bound_run(tmp_path):
    """Launch-bound steps of 5 ms (100 kernels of 2 µs), 40 of them in epochs of 10; each later epoch starts the
    loader's 8 workers again, 500 ms spent making the iterator, not waiting for a batch."""
    b = BundleBuilder(tmp_path, window=(2, 1, 2), start=DEFAULT_START + 1.0)
    b.loader(num_workers=8, site=("train.py", 40, "main"))
    for i in range(40):
        b.step(wall_s=0.505 if i in (10, 20, 30) else 0.005, gpu_busy_s=0.0002, kernels=100, kernel_name="sgemm")
    b.event(StartupEvent(phase="torch_import", seconds=0.5),
            *(LoaderStartEvent(loader_id=0, step=i, seconds=0.5, workers=8) for i in (0, 10, 20, 30)))
    return b.build()


def test_the_epochs_worker_starts_are_the_start_ups_not_the_launch_bound_steps(tmp_path) -> None:
    """The window's steps are launch-bound, but three worker starts of 500 ms make most of the steps' time: that
    time is the budget's `stall` slice, which GD702 claims; GD301 claims the launches' idle of the other steps."""
    run = restarting_launch_bound_run(tmp_path)
    timed = [s for s in run.step_view.steady_steps if s.window not in ("warmup", "active")]
    stall = 3 * 0.5 / sum(s.wall_s for s in timed)
    assert run.budget.seconds("stall") / run.budget.step_s == pytest.approx(stall, abs=0.01)
    findings = {f.code: f for f in run_rules(run, rules("GD301", "GD702")).findings}
    assert findings["GD702"].impact == pytest.approx(stall, abs=0.02)
    assert findings["GD301"].impact <= 1 - stall + 0.01
    assert "the GPU is idle 96% of each step" in findings["GD301"].title  # of the steps that do not stall
    assert findings["GD702"].impact + findings["GD301"].impact <= 1.0


def test_a_periodic_save_is_the_stall_share_gd701_claims(tmp_path) -> None:
    run = stalling_run(tmp_path)
    [finding] = run_rules(run, rules("GD701")).findings
    assert run.job_time.stall_share == pytest.approx(finding.impact, abs=0.02)


def test_a_cpu_runs_save_keeps_its_share_beside_slow_profiled_steps(tmp_path) -> None:
    """A CPU run whose main thread computes all the time, its profiled steps five times the others: the main
    thread's CPU per step is that of the steps the pace is the mean of, so the step less that work leaves the saves
    their whole share. Over every step after start-up, the slow profiled ones had made the CPU per step longer than
    the step, and checkpoint_stall.py's 12% of stalls came out as 1% on a loaded 2-core host ("info")."""
    b = BundleBuilder(tmp_path, window=(2, 1, 6))
    for i in range(40):
        stalls = i % 10 == 9
        b.step(wall_s=0.1 if stalls else 0.15 if 2 <= i < 9 else 0.03)
        if stalls:
            b.event(PauseEvent(cause="save", step=i, seconds=0.07, site=Site(file="train.py", line=60,
                                                                             function="main")))
    b.process(1.0)
    b.host_samples(interval_s=0.05)
    run = b.build()
    assert run.host.main_thread_cpu_s == pytest.approx(run.pace.seconds, rel=0.05)
    [finding] = run_rules(run, rules("GD701")).findings
    assert finding.severity == "warning"
    assert finding.impact == pytest.approx(run.job_time.stall_share, abs=0.02)


def test_a_slow_step_of_no_known_cause_is_no_stall_of_the_budget(tmp_path) -> None:
    assert stalling_run(tmp_path, pauses=False, every=8).job_time.stall_share == 0.0


def test_stalls_the_pace_leaves_out_are_no_saving_of_each_step(tmp_path) -> None:
    """Two saves of 490 ms in 120 steps of 10 ms: rarer than one step in fifty, the step at the run's pace leaves
    them out, so GD701 gives their share of the steps' time but no saving of the step, and the budget no slice."""
    b = BundleBuilder(tmp_path, window=(2, 1, 2))
    for i in range(120):
        stalls = i in (50, 100)
        b.step(wall_s=0.5 if stalls else 0.01, gpu_busy_s=0.008)
        if stalls:
            b.event(PauseEvent(cause="save", step=i, seconds=0.49, site=Site(file="train.py", line=60,
                                                                            function="main")))
    run = b.build()
    assert run.pace.seconds == pytest.approx(0.01, abs=0.001) and run.pace.stalls == 2
    [finding] = assert_fires("GD701", run, location="train.py:60")
    assert finding["impact"] is None and "rarer than one step in fifty" in finding["impact_reason"]
    assert run.job_time.stall_share == 0.0


def test_an_evaluation_then_a_save_is_one_stall_told_apart_and_its_last_one_after_the_loop_counts(tmp_path) -> None:
    """Every 100th step evaluates (untimed) and then saves (timed), the third time after the last step, as
    eval_checkpoint_bad does: one stall of two parts, sized as its share of the job's time, the third one in it."""
    evaluate = Site(file="train.py", line=29, function="evaluate")
    save = Site(file="train.py", line=43, function="step")
    b = BundleBuilder(tmp_path, window=(2, 1, 2))
    for i in range(300):
        stalls = i in (100, 200)
        b.step(wall_s=0.81 if stalls else 0.01, gpu_busy_s=0.008)
        if stalls:
            b.event(PauseEvent(cause="eval", step=i, seconds=0.0, site=evaluate),
                    PauseEvent(cause="save", step=i, seconds=0.3, site=save))
    b.event(PauseEvent(cause="eval", step=300, seconds=0.0, site=evaluate),
            PauseEvent(cause="save", step=300, seconds=0.3, site=save))
    run = b.build()
    [finding] = assert_fires("GD701", run, location="train.py:29")
    assert finding["title"].startswith("Every 100th step stalls 800 ms: an evaluation 500 ms, then torch.save "
                                       "300 ms: ")
    evidence = {row["name"]: row["value"] for row in finding["evidence"]}
    assert evidence["an evaluation at train.py:29, per stall"] == pytest.approx(500, abs=1)
    assert evidence["torch.save at train.py:43, per stall"] == pytest.approx(300, abs=1)
    assert evidence["once more after the last step"] == pytest.approx(800, abs=1)
    steady = [s for s in run.step_view.steady_steps if s.window not in ("warmup", "active") and s.index > 6]
    wall = sum(s.wall_s for s in steady)
    assert evidence["share of the job's time"] == pytest.approx(100 * 3 * 0.8 / (wall + 0.8), abs=1.5)
    assert finding["impact"] is None and "of the job's time, not of each step" in finding["impact_reason"]
    assert "evaluate less often" in finding["fix"] and "async_save" in finding["fix"]


def test_slow_steps_of_threads_taking_turns_on_the_gil_are_no_stall_of_unknown_cause(tmp_path) -> None:
    """Five threads launching GPU work once drew "every 3rd step stalls 36 ms in a cause gpudoctor does not watch"
    (steps 13, 14, 16, 19, 22, 24): the steps that waited longest for the GIL, GD501's time."""
    def run_with(threads: int, path):
        b = BundleBuilder(path, window=(2, 1, 2))
        for i in range(40):
            b.step(wall_s=0.05 if i % 8 == 7 else 0.01)
        for n in range(threads):
            b.thread(f"launcher-{n}", "launch")
        return b.build()

    assert_fires("GD701", run_with(0, tmp_path / "alone"), location=None)
    assert_silent("GD701", run_with(5, tmp_path / "threads"))


def test_a_period_holds_where_one_stall_was_too_short_to_see_and_not_for_steps_at_random() -> None:
    from gpudoctor.analysis.stalls import _period

    assert _period([9, 19, 39, 49]) == 10  # the save at step 29 went by as fast as a step
    assert _period([10, 13, 16, 19]) == 3
    assert _period([13, 14, 16, 19, 22, 24]) is None  # five threads on the GIL, slow when they waited longest
