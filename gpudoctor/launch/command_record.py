"""The record of the command gpudoctor ran, kept in its run directory, so that `gpudoctor try` can tell a run that
this user made on this host, its command as it was, from a directory made elsewhere or edited since.

A run directory is handed around, and its manifest names a script, its arguments and a working directory that
`gpudoctor try` would run again. When `gpudoctor profile` starts a script (or torchrun), it writes RECORD in the run
directory: this user's id, this host's name, the interpreter, and an HMAC-SHA256 of what a try may run again (the
script or module, its arguments and working directory; for a torchrun job its torchrun.json), keyed with a secret
of this user's that never leaves their state directory ($XDG_STATE_HOME/gpudoctor/secret, else
~/.local/state/gpudoctor/secret; mode 0600, made on first use). Only this user on this host can write a record that
checks. A record that says it was made here, by this user, with their secret, and does not check means that the
command was changed since; a directory without a record, or with another user's, host's or secret's, was made
elsewhere (or before gpudoctor kept records, or before the user's state directory was emptied).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import socket
import stat
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import msgspec

from gpudoctor.bundle.confined import bundle_file
from gpudoctor.bundle.jsonio import write_json_atomic
from gpudoctor.errors import BundleError

RECORD = ".command-record.json"  # a dot-file: a job's own bundle, moved into launcher/, leaves it in the run dir
VERSION = 1
KEY_FILE = "secret"  # in state_dir(): the HMAC key
SECRET_BYTES = 32
MAX_RECORD_BYTES = 4096

Status = Literal["recorded", "changed", "elsewhere"]


class _Record(msgspec.Struct, frozen=True):
    version: int
    user: int
    host: str
    interpreter: str
    key: str  # which secret of the user's the digest is keyed with (_key_id): one made since is another
    digest: str


@dataclass(frozen=True)
class Provenance:
    """What a run directory's record says of the command it names."""

    status: Status  # recorded: by this user here, as it is; changed: since; elsewhere: no record that checks here
    reason: str  # a clause: "recorded by you on this host when gpudoctor ran it"
    interpreter: str | None = None  # the interpreter the command was recorded with


def script_command(script: str | None, module: str | None, args: list[str], cwd: str | None) -> dict[str, object]:
    """What a try of a run runs again: the script or module, its arguments, its working directory."""
    return {"script": script, "module": module, "args": list(args), "cwd": cwd}


def job_command(torchrun: dict[str, object], cwd: str | None) -> dict[str, object]:
    """What a try of a torchrun job runs again: torchrun.json, and the working directory its ranks ran in."""
    return {"torchrun": torchrun, "cwd": cwd}


def write_record(run_dir: Path, command: dict[str, object]) -> None:
    """Record `command`, run now with this interpreter, in `run_dir`. Never raises: a run whose command could not be
    recorded (no state directory to keep the secret in) is one `gpudoctor try` treats as made elsewhere."""
    try:
        secret = _secret(create=True)
        if secret is None:
            (run_dir / RECORD).unlink(missing_ok=True)
            return
        user, host = os.getuid(), socket.gethostname()
        digest = _digest(secret, user, host, sys.executable, command)
        write_json_atomic(run_dir / RECORD, _Record(VERSION, user, host, sys.executable, _key_id(secret), digest))
    except (OSError, RuntimeError):  # RuntimeError: no home directory to be found
        with contextlib.suppress(OSError):
            (run_dir / RECORD).unlink(missing_ok=True)


def check_record(run_dir: Path, command: dict[str, object]) -> Provenance:
    """Whether `command`, as `run_dir` names it now, is the one gpudoctor recorded there, as this user on this host."""
    record = _read_record(run_dir)
    if record is None:
        return Provenance("elsewhere", "it holds no record of gpudoctor running this command as you on this host")
    user, host = os.getuid(), socket.gethostname()
    if (record.user, record.host) != (user, host):
        return Provenance("elsewhere", f"it was recorded by user {record.user} on {record.host}, not by you on "
                                       "this host", record.interpreter)
    try:
        secret = _secret(create=False)
    except (OSError, RuntimeError):
        secret = None
    if secret is None or not hmac.compare_digest(_key_id(secret), record.key):
        return Provenance("elsewhere", "it was recorded with a secret of yours that this host no longer keeps",
                          record.interpreter)
    if hmac.compare_digest(_digest(secret, user, host, record.interpreter, command), record.digest):
        return Provenance("recorded", "recorded by you on this host when gpudoctor ran it", record.interpreter)
    return Provenance("changed", "its record, made by you on this host, does not match the command it names now",
                      record.interpreter)


def _digest(secret: bytes, user: int, host: str, interpreter: str, command: dict[str, object]) -> str:
    signed = {"version": VERSION, "user": user, "host": host, "interpreter": interpreter, "command": command}
    message = json.dumps(signed, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def _key_id(secret: bytes) -> str:
    """A name for the secret that says nothing of it."""
    return hmac.new(secret, b"gpudoctor key id", hashlib.sha256).hexdigest()[:16]


def _read_record(run_dir: Path) -> _Record | None:
    try:
        path = bundle_file(run_dir, RECORD)
        if path is None:
            return None
        with open(path, "rb") as f:
            raw = f.read(MAX_RECORD_BYTES + 1)
        return None if len(raw) > MAX_RECORD_BYTES else msgspec.json.decode(raw, type=_Record)
    except (BundleError, OSError, msgspec.DecodeError, UnicodeDecodeError):
        return None


# -- the user's secret ---------------------------------------------------------------------------------------------
def state_dir() -> Path:
    """$XDG_STATE_HOME/gpudoctor (an absolute path only, as the XDG spec has it), else ~/.local/state/gpudoctor."""
    base = os.environ.get("XDG_STATE_HOME", "")
    return (Path(base) if os.path.isabs(base) else Path.home() / ".local" / "state") / "gpudoctor"


def _secret(create: bool) -> bytes | None:
    """This user's secret; made now with `create` when there is none. None when there is none, or the one there
    is not this user's alone (another's, readable by others, or no regular file)."""
    path = state_dir() / KEY_FILE
    try:
        return _read_secret(path)
    except FileNotFoundError:
        if not create:
            return None
    _make_secret(path)
    return _read_secret(path)


def _read_secret(path: Path) -> bytes | None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with open(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
            return None
        secret = f.read(SECRET_BYTES + 1)
    return secret if len(secret) == SECRET_BYTES else None


def _make_secret(path: Path) -> None:
    """A new secret, whole or not at all: written under a name of its own (mode 0600), then linked into place; a
    gpudoctor that made one meanwhile keeps its own."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, made = tempfile.mkstemp(dir=path.parent, prefix=".secret-")
    try:
        with open(fd, "wb") as f:
            f.write(os.urandom(SECRET_BYTES))
        with contextlib.suppress(FileExistsError):
            os.link(made, path)
    finally:
        os.unlink(made)
