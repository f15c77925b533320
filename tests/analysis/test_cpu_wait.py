"""The CPU side of the step measured directly (analysis.cpu_wait): each feeding thread's wait for a core, the
host's CPU pressure and the cgroup's throttling, and a plain "not measured here" where a machine keeps none."""

from __future__ import annotations

import pytest

from gpudoctor.report.cpu_wait import cpu_wait_text, notable
from gpudoctor.report.model import cpu_wait_json
from gpudoctor.testing import BundleBuilder

PIN_MEMORY_MODULE = "torch.utils.data._utils.pin_memory"


def pinned_run(tmp_path, *, measured: bool = True):
    """A main process whose pin-memory thread (its thread 1) waits 25% of the time for a core, the main thread
    10%; two workers, 40% and 20%; the host's tasks waiting 50% of the time, the cgroup throttled 5%."""
    b = BundleBuilder(tmp_path)
    b.env(cores=4)
    b.steps(8, wall_s=0.1)
    pid = b.process(thread_cores=(0.8, 0.3), run_delay_share=0.1 if measured else None,
                    thread_run_delay=(0.1, 0.25) if measured else ())
    b.thread("Thread-2 (_pin_memory_loop)", "_pin_memory_loop", module=PIN_MEMORY_MODULE, daemon=True,
             native_id=pid * 100 + 1)
    b.workers(1, run_delay_share=0.4 if measured else None)
    b.workers(1, run_delay_share=0.2 if measured else None)
    b.host_samples(cpu_pressure=0.5 if measured else None, throttled=0.05 if measured else None)
    return b.build()


def test_each_feeding_threads_wait_for_a_core_and_the_hosts_pressure(tmp_path) -> None:
    found = pinned_run(tmp_path).host.cpu_wait
    assert found.main_thread == pytest.approx(0.1, abs=0.01)
    assert found.pin_memory_thread == pytest.approx(0.25, abs=0.01)
    assert found.workers == 2 and found.loader_workers == pytest.approx(0.3, abs=0.01)  # the median
    assert found.host_pressure == pytest.approx(0.5, abs=0.02) and found.throttled == pytest.approx(0.05, abs=0.01)


def test_the_page_says_each_share_and_the_terminal_only_what_held_the_step_back(tmp_path) -> None:
    text = cpu_wait_text(cpu_wait_json(pinned_run(tmp_path)))
    assert text == ("waiting for a core: the main thread 10%, the loader's 2 workers 30% (median), the pin-memory "
                    "thread 25%; the host's CPU pressure 50%; throttled by a CPU limit 5%")
    assert notable(cpu_wait_json(pinned_run(tmp_path / "again")))


def test_what_a_machine_does_not_keep_is_said_not_measured(tmp_path) -> None:
    found = cpu_wait_json(pinned_run(tmp_path, measured=False))
    assert all(found[key] is None for key in ("main_thread", "loader_workers", "pin_memory_thread",
                                               "host_pressure", "throttled"))
    assert cpu_wait_text(found) is None and not notable(found)  # nothing measured: no line at all
    found["main_thread"] = 0.02
    assert cpu_wait_text(found) == ("waiting for a core: the main thread 2%, the loader's 2 workers not measured "
                                    "here; the host's CPU pressure not measured here; throttled by a CPU limit not "
                                    "measured here")
    assert not notable(found)
