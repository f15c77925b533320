"""gpudoctor never takes the script's last bytes of disk: below the margin it leaves (bundle.free_space) the script
is not started, said in one sentence (73); once it runs, recording stops, said once, and the script's own files and
status are those of a plain run."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import Gpudoctor, env_with, script
from gpudoctor.bundle.free_space import free_bytes
from gpudoctor.bundle.jsonio import JsonlWriter


def test_a_writer_stops_once_the_disk_is_under_the_margin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    told: list[str] = []
    monkeypatch.setenv("GPUDOCTOR_MIN_FREE_MB", str((free_bytes(tmp_path) or 0) // (1 << 20) + 1024))
    writer = JsonlWriter(tmp_path / "events.jsonl", on_failure=lambda path, error: told.append(error.strerror))
    writer.write({"kind": "step"})
    writer.write({"kind": "step"})
    assert (tmp_path / "events.jsonl").read_bytes() == b""
    assert len(told) == 1 and "gpudoctor leaves to the script" in told[0]


@pytest.mark.e2e
def test_a_disk_under_the_margin_does_not_start_the_script(gd: Gpudoctor) -> None:
    margin_mb = (free_bytes(gd.cwd) or 0) // (1 << 20) + 1024  # more than the disk has free
    marker = gd.cwd / "script_report.json"
    result = gd.profile(script("train_loop.py"), "--steps", "3", "--report", str(marker),
                        env=env_with(GPUDOCTOR_MIN_FREE_MB=str(margin_mb)))
    assert result.returncode == 73, result
    assert result.messages == [result.first_message] and "the script was not started" in result.first_message
    assert not marker.exists()
    assert not (gd.cwd / "run").exists()  # nothing made, nothing emptied


@contextlib.contextmanager
def _tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                             capture_output=True, check=False)
    if mounted.returncode != 0 or shutil.which("umount") is None:
        pytest.skip("a small disk needs a tmpfs, which this user cannot mount")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=False)


@pytest.mark.e2e
def test_a_disk_filling_up_stops_the_recording_and_leaves_the_script_its_files(gd: Gpudoctor) -> None:
    """A 20 MB disk, a margin of 16 MB, a script writing 5 MB of its own log beside the run directory."""
    with _tmpfs(gd.cwd / "disk", "20m") as disk:
        log = disk / "log.txt"
        result = gd.profile(script("writes_log.py"), str(log), "600", out=str(disk / "run"),
                            env=env_with(GPUDOCTOR_MIN_FREE_MB="16"))
        assert result.returncode == 3, result  # the script's own status
        assert log.stat().st_size == 60 * 8000 * 11  # every line it wrote
        assert "writes_log: done" in result.stdout
        stopped = [line for line in result.stderr.splitlines() if "recording stopped" in line]
        assert len(stopped) == 1 and "gpudoctor leaves to the script" in stopped[0], result.stderr
        assert (disk / "run" / "report.html").is_file()
