"""NVTX ranges are pushed only when an NVTX tool watches the run: the nvtx package (and the NumPy it imports) is
otherwise left out of the script's process."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gpudoctor.collect.markers import nvtx_tool_attached

CHECK = r"""
import json, sys
from gpudoctor.collect.markers import Markers
markers = Markers()
markers.end(markers.begin("forward"))
print(json.dumps({"status": markers.nvtx_status, "nvtx": "nvtx" in sys.modules, "numpy": "numpy" in sys.modules}))
"""


def _markers_in_a_fresh_process(monkeypatch: pytest.MonkeyPatch, injection: str | None) -> dict:
    for name in ("NVTX_INJECTION64_PATH", "NVTX_INJECTION32_PATH"):
        monkeypatch.delenv(name, raising=False)
    if injection is not None:
        monkeypatch.setenv("NVTX_INJECTION64_PATH", injection)
    done = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.e2e
def test_without_a_tool_nvtx_and_numpy_stay_unimported(monkeypatch) -> None:
    seen = _markers_in_a_fresh_process(monkeypatch, None)
    assert seen == {"status": "no NVTX tool (Nsight Systems) watches the run, so no ranges are pushed",
                    "nvtx": False, "numpy": False}


@pytest.mark.e2e
def test_under_a_tool_the_ranges_are_pushed(monkeypatch, tmp_path) -> None:
    # A path that loads nothing: NVTX then drops the ranges, as it does when the tool cannot be loaded.
    seen = _markers_in_a_fresh_process(monkeypatch, str(tmp_path / "libNoTool.so"))
    assert seen["status"] == "ok" and seen["nvtx"]


@pytest.mark.parametrize(("environ", "attached"), [
    ({}, False), ({"NVTX_INJECTION64_PATH": ""}, False),
    ({"NVTX_INJECTION64_PATH": "/opt/nsys/libToolsInjection64.so"}, True),
    ({"NVTX_INJECTION32_PATH": "/opt/nsys/libToolsInjection32.so"}, True),
])
def test_a_tool_is_known_by_its_injection_variable(environ: dict[str, str], attached: bool) -> None:
    assert nvtx_tool_attached(environ) is attached
