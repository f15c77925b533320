"""No control character of an input reaches the terminal: a script's file name, an exception's message, a received
findings.json's titles (gpudoctor.ui.terminal)."""

from __future__ import annotations

import json
import re

import pytest

from conftest import WINDOW, Gpudoctor
from gpudoctor.ui.terminal import terminal_safe

HOSTILE = "\x1b]0;pwned\x07\x1b[2J\x1b[?1049h\x9b31m"
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def test_every_control_character_but_newline_and_tab_is_written_as_its_escape() -> None:
    assert terminal_safe(f"a{HOSTILE}b\tc\n") == "a\\x1b]0;pwned\\x07\\x1b[2J\\x1b[?1049h\\x9b31mb\tc\n"


@pytest.mark.e2e
def test_a_hostile_script_name_and_exception_message_stay_text(gd: Gpudoctor) -> None:
    script = gd.cwd / f"train{HOSTILE}.py"
    script.write_text("import torch\n"
                      "for step in range(6):\n"
                      "    torch.randn(64, 64) @ torch.randn(64, 64)\n"
                      f"raise ValueError({HOSTILE!r})\n", encoding="utf-8")
    result = gd.run("profile", "--out", "run", *WINDOW, str(script))
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    # the script's own traceback is the script's, as a plain run prints it; gpudoctor's lines come after it
    first = next(i for i, line in enumerate(lines) if line.startswith("gpudoctor"))
    ours = lines[first:]
    assert not [line for line in ours if CONTROL.search(line)], ours
    assert "\\x1b]0;pwned" in result.stderr  # said, as text
    analyzed = gd.run("analyze", "run")
    assert not CONTROL.search(analyzed.stderr), analyzed.stderr


@pytest.mark.e2e
def test_diff_of_received_findings_with_hostile_titles_prints_text(gd: Gpudoctor) -> None:
    before = {"schema_version": 1, "run": {"script": f"x{HOSTILE}.py", "args": [], "steps_total": 5,
                                          "steps_analysed": 5, "median_step_s": 0.02, "step_s": 0.02,
                                          "step_s_basis": "mean", "trace_only": False, "step_source": "optimizer",
                                          "window_distortion": None},
              "summary": {"verdict": f"v{HOSTILE}"}, "findings": [
                  {"code": "GD101", "name": "n", "category": "data_starvation", "severity": "warning",
                   "title": f"title {HOSTILE}", "impact": 0.5, "evidence": [], "location": None, "fix": "f"}],
              "not_evaluated": [], "errors": []}
    after = {**before, "findings": [], "run": {**before["run"], "median_step_s": 0.01, "step_s": 0.01}}
    for name, doc in (("before.json", before), ("after.json", after)):
        (gd.cwd / name).write_text(json.dumps(doc), encoding="utf-8")
    compared = gd.run("diff", "before.json", "after.json")
    assert not CONTROL.search(compared.stdout + compared.stderr), compared
