"""The script's lines as the analysis names them: never code that torch.compile generated into its cache."""

from __future__ import annotations

import pytest

from gpudoctor.bundle.events import HostLine, HostLinesEvent
from gpudoctor.bundle.records import generated_code
from gpudoctor.testing import BundleBuilder


def test_the_host_lines_leave_out_the_code_inductor_generated(tmp_path) -> None:
    """recompiles_bad (H200): a sixth of the samples at /tmp/torchinductor_root/6e/c6ep...py:123, `call`."""
    b = BundleBuilder(tmp_path)
    b.steps(6, wall_s=0.01)
    b.event(HostLinesEvent(samples=6, interval_s=0.005, lines=[
        HostLine(file="/work/train.py", line=27, function="forward", samples=2),
        HostLine(file="/tmp/torchinductor_root/6e/c6epl.py", line=123, function="call", samples=1),
        HostLine(file="/work/train.py", line=42, function="step", samples=1)]))
    lines = b.build().sites.host_lines
    assert [(where.line, share) for where, share in lines] == [(27, pytest.approx(2 / 6)), (42, pytest.approx(1 / 6))]


@pytest.mark.parametrize(("file", "generated"), [
    ("/tmp/torchinductor_root/6e/c6eplqdysw.py", True),
    ("/home/ana/.triton/cache/ab/kernel.py", True),
    ("/home/ana/torchinductor_notes/train.py", True),  # a folder named like the cache is taken for it
    ("/home/ana/project/train.py", False),
    ("/home/ana/project/torchinductor_test.py", False),  # the file's own name is not a folder of the cache
])
def test_generated_code_is_told_by_the_cache_folders(file: str, generated: bool) -> None:
    assert generated_code(file) is generated
