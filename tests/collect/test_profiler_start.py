"""The window's profiler start leaves torch's lazily imported inductor unimported in the script's process."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e  # every test here starts processes

CHECK = r"""
import json, sys, threading
import torch
from gpudoctor.collect.window import _inductor_left_unimported

seen = {}
lazy = torch.__dict__["__getattr__"]
with _inductor_left_unimported():
    seen["here"] = hasattr(torch, "_inductor")
    seen["imported_here"] = "torch._inductor" in sys.modules
    other = threading.Thread(target=lambda: seen.update(other=hasattr(torch, "_inductor")))
    other.start()
    other.join()
seen["restored"] = torch.__dict__["__getattr__"] is lazy
seen["after"] = hasattr(torch, "_inductor")
print(json.dumps(seen))
"""


def test_only_the_starting_thread_is_told_inductor_is_absent() -> None:
    done = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen == {"here": False, "imported_here": False, "other": True, "restored": True, "after": True}
