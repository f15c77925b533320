"""`gpudoctor try` runs what a run directory names only with its user's say: it shows the command first; a directory
whose script lies inside it, or whose command was changed since gpudoctor recorded it, is refused even with --yes;
without a terminal and without --yes nothing runs; a directory made elsewhere needs an answer on a terminal."""

from __future__ import annotations

import json
import os
import pty
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import Gpudoctor, Result, _run_dir_of, env_with, script
from gpudoctor.launch import command_record

STARVED = script("starved_loader.py")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Result:
    """A run of a starved loop that gpudoctor profiled here, as this user: its fixes can be tried."""
    gd = Gpudoctor(tmp_path_factory.mktemp("recorded"))
    result = gd.profile(STARVED, "--steps", "20")
    assert result.returncode == 0, result
    return result


def _copy(recorded: Result, to: Path) -> Path:
    shutil.copytree(recorded.run_dir, to)
    return to


def _edit_manifest(run: Path, **changes: object) -> None:
    manifest = json.loads((run / "manifest.json").read_text())
    for key, value in changes.items():
        if key in ("script", "args"):
            manifest["target"][key] = value
        else:
            manifest[key] = value
    (run / "manifest.json").write_text(json.dumps(manifest))


def _marker_script(path: Path, marker: Path) -> Path:
    """A script that would leave `marker` behind if it ran."""
    path.write_text(f"open({str(marker)!r}, 'w').close()\n")
    return path


def _received(recorded: Result, tmp_path: Path, how: str) -> Path:
    """A copy of the recorded run as someone else would send it: without a record, or with another host's."""
    run = _copy(recorded, tmp_path / "cwd" / "received")
    if how == "no record":
        (run / command_record.RECORD).unlink()
    else:
        record = json.loads((run / command_record.RECORD).read_text())
        (run / command_record.RECORD).write_text(json.dumps({**record, "host": "their-cluster-node-7"}))
    return run


def _command_shown(result: Result) -> str:
    return next(line for line in result.stderr.splitlines() if line.startswith("  command:"))


@pytest.mark.parametrize("record", ["kept", "removed"])
def test_a_script_inside_the_run_directory_is_refused_even_with_yes(recorded: Result, gd: Gpudoctor,
                                                                    record: str) -> None:
    run = _copy(recorded, gd.cwd / "shared_run")
    marker = gd.cwd.parent / "ran"
    _marker_script(run / "evil.py", marker)
    _edit_manifest(run, script="evil.py", cwd=str(run))
    if record == "removed":
        (run / command_record.RECORD).unlink()
    result = gd.run("try", "--yes", "shared_run")
    assert result.returncode == 77, result
    assert not marker.exists() and not (run / "tries").exists()
    assert _command_shown(result).split()[-3:] == ["evil.py", "--steps", "20"]
    assert result.messages[-1] == (f"gpudoctor: refused: the script {run / 'evil.py'} lies inside the run directory "
                                   "shared_run, and gpudoctor try never runs code that a run directory holds, not "
                                   "even with --yes.")


@pytest.mark.e2e
@pytest.mark.parametrize("how", ["no record", "another host's record"])
def test_a_received_script_elsewhere_runs_nothing_without_a_terminal(recorded: Result, tmp_path: Path,
                                                                     how: str) -> None:
    run = _received(recorded, tmp_path, how)
    marker = tmp_path / "ran"
    elsewhere = _marker_script(tmp_path / "train.py", marker)
    _edit_manifest(run, script=str(elsewhere))
    gd = Gpudoctor(tmp_path / "cwd")
    for args in (("try", "received"), ("try", "--yes", "received")):
        result = gd.run(*args)
        assert result.returncode == 77, result
        assert not marker.exists() and not (run / "tries").exists()
        assert _command_shown(result) == f"  command:       {sys.executable} {elsewhere} --steps 20"
        made = next(line for line in result.stderr.splitlines() if line.startswith("  run directory:"))
        assert "made elsewhere: " in made
        assert result.messages[-1] == (
            "gpudoctor: nothing was run: received was made elsewhere, so only your answer on a terminal confirms the "
            "command above (--yes confirms only a run directory recorded by you on this host): run gpudoctor try "
            "received on a terminal.")


def test_a_command_changed_since_it_was_recorded_is_refused_even_with_yes(recorded: Result, gd: Gpudoctor) -> None:
    run = _copy(recorded, gd.cwd / "edited")
    _edit_manifest(run, args=["--steps", "20", "--checkpoint", str(gd.cwd.parent / "elsewhere.pt")])
    result = gd.run("try", "--yes", "edited")
    assert result.returncode == 77, result
    assert not (run / "tries").exists() and not (gd.cwd.parent / "elsewhere.pt").exists()
    assert result.messages[-1] == ("gpudoctor: refused: edited's command was changed since gpudoctor ran it and "
                                   "recorded it, as you on this host, so gpudoctor try does not run it, not even with "
                                   "--yes; profile the script again to try its fixes.")


@pytest.mark.e2e
def test_the_users_own_run_without_a_terminal_says_how_to_confirm(recorded: Result) -> None:
    gd = Gpudoctor(recorded.run_dir.parent)
    result = gd.run("try", "run", "--finding", "GD101")
    assert result.returncode == 77, result
    shown = result.stderr.splitlines()
    assert "  run directory: run, recorded by you on this host when gpudoctor ran it" in shown
    assert any(line.startswith("  fixes:         GD101: DataLoader(num_workers=") for line in shown), shown
    assert result.messages[-1] == ("gpudoctor: nothing was run: there is no terminal to confirm the command above on; "
                                   "to run it, add --yes: gpudoctor try --yes run --finding GD101.")
    assert not (recorded.run_dir / "tries").exists()


def _on_terminal(gd: Gpudoctor, answer: str, *args: str) -> Result:
    """gpudoctor with a pseudo-terminal as its stdin, on which `answer` has been typed."""
    main, child = pty.openpty()
    try:
        os.write(main, f"{answer}\n".encode())
        done = subprocess.run(gd.command(*args), cwd=gd.cwd, env=env_with(), stdin=child, capture_output=True,
                              text=True, timeout=180)
    finally:
        os.close(main)
        os.close(child)
    return Result(done.returncode, done.stdout, done.stderr, _run_dir_of(args, done.stderr, gd.cwd))


@pytest.mark.e2e
def test_on_a_terminal_a_received_run_runs_only_once_answered_yes(recorded: Result, tmp_path: Path) -> None:
    run = _received(recorded, tmp_path, "no record")
    marker = tmp_path / "ran"
    _edit_manifest(run, script=str(_marker_script(tmp_path / "train.py", marker)))
    gd = Gpudoctor(tmp_path / "cwd")
    refused = _on_terminal(gd, "n", "try", "received", "--finding", "GD101")
    assert refused.returncode == 77, refused
    assert not marker.exists()
    assert refused.messages[-1] == ("gpudoctor: run it? [y/N] gpudoctor: nothing was run: you did not confirm the "
                                    "command above.")
    tried = _on_terminal(gd, "y", "try", "--yes", "received", "--finding", "GD101", "--try-steps", "5")
    assert tried.returncode == 0, tried
    assert marker.exists()
    assert ("gpudoctor: --yes confirms only a run directory recorded by you on this host, and received was made "
            "elsewhere.") in tried.messages


@pytest.mark.e2e
def test_a_tries_folder_linked_out_of_the_run_is_not_written(recorded: Result, tmp_path: Path) -> None:
    run = _copy(recorded, tmp_path / "cwd" / "run")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (run / "tries").symlink_to(elsewhere, target_is_directory=True)
    result = Gpudoctor(tmp_path / "cwd").run("try", "--yes", "run", "--finding", "GD101")
    assert result.returncode == 0, result
    assert list(elsewhere.iterdir()) == []
    tried = next(f for f in json.loads((run / "findings.json").read_text())["findings"] if f["code"] == "GD101")
    assert (tried["tried"]["status"], tried["tried"]["reason"]) == (
        "not_applicable", "run/tries is a link out of the run directory, and gpudoctor writes the tries only inside it")


def test_the_secret_is_the_users_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    command = command_record.script_command("train.py", None, ["--lr", "3e-4"], str(tmp_path))
    command_record.write_record(tmp_path, command)
    secret = tmp_path / "state" / "gpudoctor" / "secret"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600 and stat.S_IMODE(secret.parent.stat().st_mode) == 0o700
    assert command_record.check_record(tmp_path, command).status == "recorded"
    assert command_record.check_record(tmp_path, {**command, "args": ["--lr", "1"]}).status == "changed"
    secret.chmod(0o644)  # readable by others: anyone could make a record that checks
    assert command_record.check_record(tmp_path, command).status == "elsewhere"
    command_record.write_record(tmp_path, command)
    assert not (tmp_path / command_record.RECORD).exists()
    older = tmp_path / "older"
    older.mkdir()
    secret.unlink()
    command_record.write_record(older, command)  # with a new secret
    secret.unlink()  # the state directory emptied since: the runs recorded before were made elsewhere, not changed
    command_record.write_record(tmp_path, command)
    assert command_record.check_record(older, command).status == "elsewhere"
    assert command_record.check_record(tmp_path, command).status == "recorded"
