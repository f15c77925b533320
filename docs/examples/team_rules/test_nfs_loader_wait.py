"""Tests of ACME101 slow-loader-wait: on bundles built in code, and on a run recorded on a GPU."""

from gpudoctor.testing import BundleBuilder, assert_fires, assert_silent, load_fixture

from nfs_loader_wait import slow_loader_wait


def nfs_run(tmp_path, data_wait_s):
    """Ten steps of 400 ms, each waiting `data_wait_s` for a DataLoader built at train.py:40."""
    b = BundleBuilder(tmp_path)
    b.loader(num_workers=4, site=("train.py", 40, "main"))
    b.steps(10, wall_s=0.4, data_wait_s=data_wait_s, gpu_busy_s=0.1)
    return b.build()


def test_fires_when_steps_wait_over_200_ms(tmp_path):
    findings = assert_fires(slow_loader_wait, nfs_run(tmp_path, 0.25), count=1, location="train.py:40")
    assert findings[0]["title"] == "10 of 10 steps waited more than 200 ms for data"


def test_silent_when_reads_are_fast(tmp_path):
    assert_silent(slow_loader_wait, nfs_run(tmp_path, 0.05))


def test_the_limit_is_an_option(tmp_path):
    assert_silent(slow_loader_wait, nfs_run(tmp_path, 0.25), options={"max_wait_s": 0.3})


def test_fires_on_a_recorded_run():
    run = load_fixture("data_starvation_cpu_bound_bad")  # recorded on a GPU: 16 workers, decoding on the CPU
    assert_fires(slow_loader_wait, run, count=1, title="2 of 30 steps")


def test_the_rule_is_a_function(tmp_path):
    [finding] = slow_loader_wait(nfs_run(tmp_path, 0.25), max_wait_s=0.2)  # the Findings it yields, as they are
    assert finding.location.line == 40 and finding.evidence["longest wait"] == (250.0, "ms")
    assert slow_loader_wait.rule.options == {"max_wait_s": 0.2}
