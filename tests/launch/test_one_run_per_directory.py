"""One `gpudoctor profile` records into a run directory at a time: a second one with the same --out is refused
before it touches anything, and `analyze` of a run still being recorded says so."""

from __future__ import annotations

import time

import pytest

from conftest import RUN_TIMEOUT_S, WINDOW, Gpudoctor, checked_findings
from gpudoctor.errors import EXIT_BAD_BUNDLE, EXIT_CANT_CREATE

pytestmark = pytest.mark.e2e

SLOW_LOOP = ("import time, torch\n"
             "model = torch.nn.Linear(8, 8)\n"
             "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
             "for step in range(40):\n"
             "    loss = model(torch.randn(4, 8)).sum()\n"
             "    optimizer.zero_grad(); loss.backward(); optimizer.step()\n"
             "    time.sleep(0.1)\n"
             "print('first run done')\n")


def test_a_second_run_into_the_same_directory_is_refused_and_the_first_keeps_its_files(gd: Gpudoctor) -> None:
    (gd.cwd / "slow.py").write_text(SLOW_LOOP)
    (gd.cwd / "quick.py").write_text("print('second run')\n")
    first = gd.start("profile", "--out", "run", *WINDOW, "slow.py")
    manifest = gd.cwd / "run" / "manifest.json"
    deadline = time.monotonic() + 60
    while not manifest.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    second = gd.run("profile", "--out", "run", "quick.py")
    assert second.returncode == EXIT_CANT_CREATE, second
    assert "another gpudoctor profile" in second.stderr and "the script was not run" in second.stderr
    assert "second run" not in second.stdout
    analysed = gd.run("analyze", "run")
    assert analysed.returncode == EXIT_BAD_BUNDLE and "still being recorded" in analysed.stderr, analysed
    out, err = first.communicate(timeout=RUN_TIMEOUT_S)
    assert first.returncode == 0, err[-2000:]
    assert "first run done" in out
    findings = checked_findings(gd.cwd / "run" / "findings.json")
    assert findings["run"]["script"].endswith("slow.py") and findings["run"]["steps_total"] == 40
    assert not (gd.cwd / "run" / ".recording").exists()
    again = gd.run("profile", "--out", "run", "quick.py")  # the first has ended: the directory is free again
    assert again.returncode == 0, again
