"""Edge cases of the built-in rules on bundles built in code: the boundaries of each threshold, missing
data (not evaluated, never "passed"), and what no recording machine can show safely (a swapping host)."""

from __future__ import annotations

import pytest

from gpudoctor.analysis import NotEvaluated
from gpudoctor.testing import BundleBuilder, assert_fires, assert_not_evaluated, assert_silent, run_rule

GiB = 1024 ** 3
MB = 1024 ** 2


def starved(tmp_path, *, workers: int = 0, wait: float = 0.06, cores: int = 8) -> BundleBuilder:
    b = BundleBuilder(tmp_path)
    b.env(cores=cores)
    b.loader(num_workers=workers, batch_size=32, site=("train.py", 41, "main"))
    b.steps(6, wall_s=0.1, data_wait_s=wait, gpu_busy_s=0.03)
    return b


def test_loader_in_main_process_suggests_workers_from_the_cores(tmp_path) -> None:
    findings = assert_fires("GD101", starved(tmp_path, cores=8).build(), count=1, location="train.py:41")
    assert "num_workers=" in findings[0]["fix"] and "train.py:41" in findings[0]["fix"]
    # load 60 ms over 2+ workers hides behind 40 ms of compute: the step shrinks to max(40 ms, 60/k ms)
    assert findings[0]["impact"] == pytest.approx(0.6, abs=0.02)


def test_a_tensor_dataset_read_per_sample_is_told_to_index_whole_batches(tmp_path) -> None:
    """Workers add the cost of sending each batch between processes to a dataset that is in memory already."""
    b = BundleBuilder(tmp_path)
    b.loader(num_workers=0, batch_size=256, dataset="TensorDataset", sampler="RandomSampler",
             site=("train.py", 41, "main"))
    b.steps(6, wall_s=0.1, data_wait_s=0.03, gpu_busy_s=0.01)
    [finding] = assert_fires("GD101", b.build(), count=1)
    assert finding["fix"].startswith("DataLoader(dataset, sampler=BatchSampler(RandomSampler(dataset), "
                                     "batch_size=256, drop_last=False), batch_size=None) at train.py:41")
    assert "num_workers" not in finding["fix"]
    assert finding["impact"] == pytest.approx(0.3, abs=0.02)


def test_a_tensor_dataset_indexed_by_batches_is_told_about_workers(tmp_path) -> None:
    b = BundleBuilder(tmp_path)
    b.loader(num_workers=0, batch_size=None, dataset="TensorDataset", sampler="BatchSampler")
    b.steps(6, wall_s=0.1, data_wait_s=0.03, gpu_busy_s=0.01)
    [finding] = assert_fires("GD101", b.build(), count=1)
    assert finding["fix"].startswith("DataLoader(..., num_workers=")


def test_loader_in_main_process_is_silent_below_its_threshold(tmp_path) -> None:
    assert_silent("GD101", starved(tmp_path, wait=0.01).build())


def test_loader_rules_are_not_evaluated_without_a_loader(tmp_path) -> None:
    b = BundleBuilder(tmp_path)
    b.steps(5, wall_s=0.1)
    assert_not_evaluated("GD101", b.build(), "no DataLoader")


def test_too_few_workers_needs_busy_workers_and_spare_cores(tmp_path) -> None:
    b = starved(tmp_path / "busy", workers=2, wait=0.07, cores=16)
    b.workers(2, cores=1.0)
    b.host_samples()
    assert_fires("GD102", b.build(), count=1)
    idle = starved(tmp_path / "idle", workers=2, wait=0.07, cores=16)
    idle.workers(2, cores=0.1)  # workers that wait on storage, not on the CPU
    idle.host_samples()
    assert_silent("GD102", idle.build())


def test_too_few_workers_are_judged_by_the_typical_one(tmp_path) -> None:
    # Without persistent_workers each epoch starts two new workers; the first pair lived while the main process
    # was slow and idled with full queues, the next three pairs were busy (pytorch/examples' dcgan).
    b = starved(tmp_path, workers=2, wait=0.07, cores=16)
    b.workers(2, cores=0.1)
    b.workers(6, cores=0.8)
    b.host_samples()
    assert_fires("GD102", b.build(), count=1)


def test_the_workers_are_the_processes_torch_named(tmp_path) -> None:
    # A spawned job's main process also has multiprocessing's resource tracker for a child, idle: it is no worker.
    b = starved(tmp_path, workers=1, wait=0.07, cores=16)
    b.process(0.0, name="python3")
    b.workers(1, cores=0.9)
    b.host_samples()
    findings = assert_fires("GD102", b.build(), count=1)
    assert findings[0]["title"].startswith("1 DataLoader worker cannot keep up")


def test_too_few_workers_are_judged_over_the_steps_that_starve(tmp_path) -> None:
    """A short window fed from prefetched batches catches the workers idle; the steps after it starve while the
    workers are busy. Their CPU is taken over the steps the data wait is measured on, not the window alone."""
    b = BundleBuilder(tmp_path, window=(2, 0, 4))
    b.env(cores=16)
    b.loader(num_workers=2, batch_size=32, site=("train.py", 41, "main"))
    b.steps(6, wall_s=0.1, gpu_busy_s=0.03)  # start-up and the window: batches ready
    b.steps(20, wall_s=0.1, data_wait_s=0.07, gpu_busy_s=0.03)  # after it: every step waits
    b.host_samples()
    steps = b.build().step_view.all_steps
    first, window_end, run_end = b.start - 1.0, steps[5].end, steps[-1].end

    def worker_cpu(t: float) -> float:  # 0.05 core until the window ends, a whole core after it
        return 0.05 * (min(t, window_end) - first) + max(0.0, t - window_end)

    times = [first + 0.1 * i for i in range(int((run_end + 0.5 - first) * 10) + 1)]
    rows = [{"t": t, "procs": [{"pid": b.pid, "ppid": b.pid - 1, "name": "python", "cpu_s": t - first},
                               *({"pid": b.pid + k, "ppid": b.pid, "name": "pt_data_worker", "cpu_s": worker_cpu(t)}
                                 for k in (1, 2))]}
            for t in times]
    b.sample_rows("procs", rows)
    assert_fires("GD102", b.build(), count=1)


def test_cpu_bound_loader_is_told_apart_from_other_programs(tmp_path) -> None:
    own = starved(tmp_path / "own", workers=8, wait=0.07, cores=8)
    own.workers(8, cores=0.85)  # with the main process: 7.8 of 8 cores
    own.host_samples()
    assert_fires("GD103", own.build(), count=1)
    others = starved(tmp_path / "others", workers=8, wait=0.07, cores=8)
    others.workers(8, cores=0.2)  # with the main process: 2.6 cores
    others.host_samples(other_cores=5.3)
    assert_silent("GD103", others.build())
    assert_fires("GD504", others.build(), count=1)


def contended(tmp_path, *, gpu_busy_s: float | None = None) -> BundleBuilder:
    """Two cores, 1.5 of them taken by other programs; the main thread waits for a core 40% of the time."""
    b = BundleBuilder(tmp_path)
    b.env(cores=2)
    b.steps(6, wall_s=0.1, gpu_busy_s=gpu_busy_s)
    b.process(0.5, run_delay_share=0.4)
    b.host_samples(other_cores=1.5)
    return b


def test_contention_costs_the_time_the_main_thread_waits_for_a_core(tmp_path) -> None:
    finding = assert_fires("GD504", contended(tmp_path).build(), count=1)[0]
    # The 40% wait counts in proportion to the busy CPU other programs take: 1.5 of 2 cores.
    assert finding["impact"] == pytest.approx(0.4 * 1.5 / 2.0, abs=0.01)
    assert {"name": "main thread waiting for a core", "value": 40.0, "unit": "%"} in finding["evidence"]


def test_contention_never_promises_a_step_faster_than_the_jobs_own_work(tmp_path) -> None:
    """Four workers each busy 0.9 of a core for every 100 ms step: 90 ms of their CPU per batch each, which no
    neighbour's leaving gives back. Whatever the neighbours take, the step stays at least 90 ms."""
    b = starved(tmp_path, workers=4, wait=0.09, cores=8)
    b.process(0.3, run_delay_share=0.5)
    b.workers(4, cores=0.9, run_delay_share=0.3)
    b.host_samples(other_cores=4.0, cpu_pressure=0.6, throttled=None)
    [finding] = assert_fires("GD504", b.build(), count=1)
    assert finding["impact"] == pytest.approx(0.1, abs=0.02)
    evidence = {e["name"]: e["value"] for e in finding["evidence"]}
    assert evidence["loader workers waiting for a core (median)"] == 30.0
    assert evidence["host CPU pressure"] == pytest.approx(60.0, abs=1)
    assert "throttled by a CPU limit" not in evidence  # not readable here: no figure


def test_contention_in_a_run_that_ended_before_its_first_step_gives_no_saving(tmp_path) -> None:
    """A run interrupted before its first step once said GD504 "fix saves ~67%" of a step it never took."""
    b = BundleBuilder(tmp_path)
    b.env(cores=2)
    b.process(0.5, run_delay_share=0.4)
    b.host_samples(other_cores=1.5)
    [finding] = run_rule("GD504", b.build())
    assert finding["impact"] is None and "before its first step" in finding["impact_reason"]


def test_a_waiting_host_costs_nothing_while_the_gpu_is_busy(tmp_path) -> None:
    finding = run_rule("GD504", contended(tmp_path, gpu_busy_s=0.1).build())
    assert len(finding) == 1 and finding[0]["impact"] == pytest.approx(0.0, abs=0.01)
    assert finding[0]["severity"] == "info"


def test_host_swapping_is_critical(tmp_path) -> None:
    b = BundleBuilder(tmp_path)
    b.steps(5, wall_s=0.1)
    b.process(1.0)
    b.host_samples(swap_in_bps=40 * MB, swap_out_bps=10 * MB)
    findings = assert_fires("GD401", b.build(), count=1, severity="critical")
    assert findings[0]["impact"] is None and findings[0]["impact_reason"]


def test_nearly_full_host_memory_warns(tmp_path) -> None:
    b = BundleBuilder(tmp_path)
    b.env(memory_total=64 * GiB)
    b.steps(5, wall_s=0.1)
    b.host_samples(mem_available=1 * GiB)
    assert_fires("GD401", b.build(), count=1, severity="warning", title="nearly full")


def test_healthy_host_memory_is_silent(tmp_path) -> None:
    b = BundleBuilder(tmp_path)
    b.steps(5, wall_s=0.1)
    b.host_samples()
    assert_silent("GD401", b.build())


def test_gil_rule_is_silent_on_free_threaded_python(tmp_path) -> None:
    b = BundleBuilder(tmp_path)
    b.env(gil_enabled=False)
    b.thread("feeder-1")
    b.thread("feeder-2")
    b.steps(5, wall_s=0.1, gil=0.004)
    b.process(1.0, thread_cores=[0.5, 0.5])
    assert_silent("GD501", b.build())


def test_gil_contention_fires_with_busy_threads_and_a_late_probe(tmp_path) -> None:
    b = BundleBuilder(tmp_path)
    b.thread("feeder-1", site=("train.py", 30, "main"), native_id=b.pid * 100 + 1)
    b.thread("feeder-2", site=("train.py", 30, "main"), native_id=b.pid * 100 + 2)
    b.steps(5, wall_s=0.1, gil=0.004)
    b.process(1.0, thread_cores=[0.1, 0.45, 0.45])
    findings = assert_fires("GD501", b.build(), count=1, location="train.py:30")
    assert findings[0]["impact"] is None  # no GPU timeline: the cost is not guessed


def test_busy_threads_outside_python_are_not_gil_contention(tmp_path) -> None:
    b = BundleBuilder(tmp_path)  # the main thread and an intra-op thread busy: the GIL is not shared
    b.steps(5, wall_s=0.1, gil=0.004)
    b.process(1.0, thread_cores=[0.5, 0.45])
    assert_silent("GD501", b.build())


def test_a_fork_crash_is_critical_even_without_a_fork_event(tmp_path) -> None:
    b = BundleBuilder(tmp_path)
    b.steps(3, wall_s=0.1)
    b.exit("exception", 1, exception="RuntimeError", where=("train.py", 12, "main"),
           message="Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, ...")
    assert_fires("GD502", b.build(), count=1, severity="critical", location="train.py:12")


def test_dataloader_forks_after_cuda_init_are_left_alone(tmp_path) -> None:
    # PyTorch supports them: a worker whose dataset touches CUDA crashes the run, which GD502 does report.
    b = BundleBuilder(tmp_path)
    b.steps(3, wall_s=0.1)
    b.fork(cuda_initialized=True, dataloader_worker=True)
    b.fork(cuda_initialized=True, dataloader_worker=True)
    assert_silent("GD502", b.build())


def test_forks_before_cuda_init_are_fine(tmp_path) -> None:
    b = BundleBuilder(tmp_path)
    b.steps(3, wall_s=0.1)
    b.fork(cuda_initialized=False, dataloader_worker=False)
    assert_silent("GD502", b.build())


def test_launch_bound_rule_needs_a_gpu_timeline(tmp_path) -> None:
    b = BundleBuilder(tmp_path)
    b.steps(5, wall_s=0.01)
    b.without_trace("the profiler could not start")
    with pytest.raises(NotEvaluated, match="no profiler trace"):
        run_rule("GD301", b.build())


def test_launch_bound_steps_fire_on_tiny_kernels(tmp_path) -> None:
    b = BundleBuilder(tmp_path)
    b.steps(5, wall_s=0.01, gpu_busy_s=0.003, kernels=200)
    [finding] = assert_fires("GD301", b.build(), count=1)
    # matrix products, which compiling leaves as they are: the fix is CUDA graphs, sized by the launches' idle
    assert finding["impact"] == pytest.approx(0.7, abs=0.03)
    assert "remedy" not in finding and 'mode="reduce-overhead"' in finding["fix"]
    evidence = {e["name"]: e["value"] for e in finding["evidence"]}
    assert evidence["step with CUDA graphs (est.)"] == pytest.approx(3.0, abs=0.3)
    assert evidence["step compiled (est.)"] == pytest.approx(10.0, abs=0.1)


LINEAR_NORM_GELU = ["volta_sgemm_128x64_nn", "void at::native::vectorized_layer_norm_kernel<float, float, false>",
                    "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>"]


def test_launch_bound_steps_of_fusible_kernels_are_sized_by_what_compiling_removes(tmp_path) -> None:
    """Each run of fusible kernels becomes one kernel per reduction in it: a step of gemm, layer norm and GELU
    launches two of its three kernels compiled (analysis.fusion)."""
    b = BundleBuilder(tmp_path)
    b.steps(5, wall_s=0.01, gpu_busy_s=0.003, kernels=198, kernel_name=LINEAR_NORM_GELU)
    [finding] = assert_fires("GD301", b.build(), count=1)
    assert finding["impact"] == pytest.approx(1 / 3, abs=0.02)
    assert finding["remedy"] == {"compile": "inductor"}


def _launch_bound(tmp_path, module: str | None = None, graphs: bool = False) -> BundleBuilder:
    b = BundleBuilder(tmp_path)
    b.steps(5, wall_s=0.01, gpu_busy_s=0.003, kernels=198, kernel_name=LINEAR_NORM_GELU)
    if module:
        b.forward_site(module)
    if graphs:
        for step in range(5):
            b.cuda_call("cudaGraphLaunch", step=step, dur=0.00002)
    return b


@pytest.mark.parametrize(("module", "graphs", "advice"), [
    ("Net", False, "wrap the model in torch.compile(model)"),
    ("OptimizedModule", False, 'torch.compile(model, mode="reduce-overhead")'),
    ("OptimizedModule", True, "compile what launches outside the CUDA graphs the step replays already"),
])
def test_launch_bound_fix_builds_on_what_the_step_does_already(tmp_path, module, graphs, advice) -> None:
    [finding] = assert_fires("GD301", _launch_bound(tmp_path, module, graphs).build(), count=1)
    assert advice in finding["fix"]


@pytest.mark.parametrize(("frameworks", "advice"), [
    (["transformers"], "compile the model to fuse kernels: TrainingArguments(torch_compile=True)"),
    (["lightning"], "compile the model to fuse kernels: model = torch.compile(model) before trainer.fit(model)"),
])
def test_launch_bound_fix_names_the_frameworks_setting(tmp_path, frameworks, advice) -> None:
    b = _launch_bound(tmp_path, "BertForSequenceClassification")
    b.loader(batch_size=4)
    b.env(frameworks=frameworks)
    [finding] = assert_fires("GD301", b.build(), count=1)
    assert finding["fix"].startswith(advice)
    per_device = "TrainingArguments(per_device_train_batch_size=" in finding["fix"]
    assert per_device == (frameworks == ["transformers"])


def test_a_sync_that_torch_amp_makes_for_the_line_gets_its_own_fix(tmp_path) -> None:
    b = BundleBuilder(tmp_path)
    b.steps(5, wall_s=0.1)
    b.sync("item", host_s=0.01, via="torch.amp.grad_scaler", site=("train.py", 60, "main"))
    b.sync("item", host_s=0.01, via="lightning.pytorch.loops.fetchers", site=("train.py", 70, "main"))
    b.without_trace()
    scaler, library = assert_fires("GD211", b.build(), count=2)
    assert scaler["title"].startswith(".item() in torch.amp.grad_scaler makes the host wait")
    assert "fused=True" in scaler["fix"] and "loss.detach()" not in scaler["fix"]
    assert library["fix"].startswith("the call is made by lightning.pytorch.loops.fetchers for this line")


def test_sync_cost_without_a_gpu_timeline_is_the_blocked_time(tmp_path) -> None:
    b = BundleBuilder(tmp_path)
    b.steps(5, wall_s=0.1)
    for step in range(5):
        b.sync("item", host_s=0.01, count=2, step=step, site=("train.py", 58, "train_step"))
    b.without_trace()
    findings = assert_fires("GD211", b.build(), count=1, location="train.py:58")
    assert findings[0]["impact"] == pytest.approx(0.1, abs=0.01)


def _synced_steps(tmp_path, host_s: float) -> BundleBuilder:
    # 10 ms steps: 4 ms of kernels, then a synchronize, then 6 ms of GPU idle till the next step's launch;
    # two lines sync once a step each, the host blocked `host_s` in each call.
    b = BundleBuilder(tmp_path)
    for step in b.steps(5, wall_s=0.010):
        b.kernels([(step, 0.0, 0.004)])
        b.cuda_call("cudaStreamSynchronize", step=step, at=0.0039, dur=0.0002)
    b.sync("item", host_s=host_s, site=("train.py", 58, "train_step"))
    b.sync("item", host_s=host_s, site=("train.py", 61, "train_step"))
    return b


def test_a_sync_saves_the_idle_after_it_when_the_host_is_ahead(tmp_path) -> None:
    findings = assert_fires("GD211", _synced_steps(tmp_path, host_s=0.003).build(), count=2)
    assert [f["impact"] for f in findings] == pytest.approx([0.3, 0.3], abs=0.01)  # the 60% idle, shared


def test_a_sync_saves_no_more_than_the_host_waits_in_it(tmp_path) -> None:
    # The host blocked 0.15 ms in each call: the GPU had little left to do, and without the calls the host
    # would gain only those 0.3 ms a step (3%), whatever the idle after them.
    findings = assert_fires("GD211", _synced_steps(tmp_path, host_s=0.00015).build(), count=2)
    assert [f["impact"] for f in findings] == pytest.approx([0.015, 0.015], abs=0.002)


def test_a_few_long_waits_are_not_averaged_away(tmp_path) -> None:
    b = BundleBuilder(tmp_path)
    b.loader(num_workers=0, batch_size=32, site=("train.py", 41, "main"))
    for index in range(30):
        b.step(wall_s=0.1, data_wait_s=0.08 if index % 10 == 0 else 0.0, gpu_busy_s=0.09)
    findings = assert_fires("GD101", b.build(), count=1)  # 3 of 30 steps: 8% on average, under 15%
    assert {"name": "steps waiting over half their time", "value": "3 of 30", "unit": None} in findings[0]["evidence"]


def test_a_pinned_loaders_pin_memory_thread_is_no_python_thread_sharing_the_work(tmp_path) -> None:
    """DataLoader(pin_memory=True) runs torch's pin-memory thread in the training process, here as busy as the main
    thread: the copy and sync rules still run (they once said "several Python threads share the work"), while a
    thread the script started itself is one."""
    from gpudoctor.engine import builtin_rules, run_rules

    def run_with(module: str, path):
        b = BundleBuilder(path)
        b.loader(num_workers=4, pin_memory=True)
        b.steps(12, wall_s=0.02, gpu_busy_s=0.01)
        b.sync("item", host_s=0.004)
        pid = b.process(1.0, thread_cores=(0.5, 0.5))
        b.thread("Thread-2 (_pin_memory_loop)", "_pin_memory_loop", module=module, daemon=True, native_id=pid * 100 + 1)
        return b.build()

    pinned = run_with("torch.utils.data._utils.pin_memory", tmp_path / "pinned")
    assert pinned.host.python_threads_sharing == 1
    result = run_rules(pinned, builtin_rules())
    assert "GD211" not in {row.code for row in result.not_evaluated}
    own = run_with("__main__", tmp_path / "own")
    assert own.host.python_threads_sharing == 2
    assert "GD211" in {row.code for row in run_rules(own, builtin_rules()).not_evaluated}
