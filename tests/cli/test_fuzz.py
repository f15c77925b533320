"""Seeded mutations of a recorded bundle and of a bare trace, each analysed by `gpudoctor analyze` (in one
subprocess, under a memory cap, each case under a time limit): every case exits 0 with a strict, schema-valid
findings.json, or 65 with one sentence from gpudoctor; never a traceback, never 70, never a hang."""

from __future__ import annotations

import gzip
import json
import random
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import REPO, checked_findings, env_with

pytestmark = pytest.mark.e2e  # every test here starts processes

BUNDLE = REPO / "fixtures" / "bundles" / "blocking_copy_d2h_bad"
FILES = ("manifest.json", "events.jsonl", "samples/host.jsonl", "samples/procs.jsonl", "samples/gpu.jsonl",
         "trace.json.gz")
CASES_PER_KIND = 12
SECONDS_PER_CASE = 20
MEMORY_CAP = 3 << 30
# The driver, with its address space capped: a case that would eat the memory fails alone instead.
CAPPED = ("import resource, runpy, sys; resource.setrlimit(resource.RLIMIT_AS, ({cap}, {cap})); "
          "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")


def _truncate(raw: bytes, rng: random.Random) -> bytes:
    return raw[:rng.randrange(len(raw))]


def _flip(raw: bytes, rng: random.Random) -> bytes:
    flipped = bytearray(raw)
    for _ in range(rng.randint(1, 20)):
        flipped[rng.randrange(len(flipped))] = rng.randrange(256)
    return bytes(flipped)


def _wrong_type(raw: bytes, rng: random.Random) -> bytes:
    lines = raw.splitlines()
    index = rng.randrange(len(lines))
    try:
        record = json.loads(lines[index])
    except ValueError:
        return raw
    if isinstance(record, dict) and record:
        record[rng.choice(sorted(record))] = rng.choice([None, "x", [1], {"a": 1}, -1, 1e308, True])
    lines[index] = json.dumps(record).encode()
    return b"\n".join(lines) + b"\n"


def _deep(raw: bytes, rng: random.Random) -> bytes:
    return raw + b"\n" + b"[" * 100_000 + b"]" * 100_000 + b"\n"


def _deep_value(raw: bytes, rng: random.Random) -> bytes:
    """A value nested 100,000 deep inside a record: `{"kind": [[[...]]]}` in a JSONL file, a key of a document."""
    deep = b"[" * 100_000 + b"]" * 100_000
    if raw.lstrip().startswith(b"{") and b"\n{" in raw and not raw.lstrip().startswith(b'{\n  "schema'):
        return raw + b'{"kind": ' + deep + b"}\n"
    return raw.replace(b"{", b'{"deep": ' + deep + b", ", 1)


def _bomb(raw: bytes, rng: random.Random) -> bytes:
    """Blanks after the content, enough that the file inflates hundreds of times its size once gzipped."""
    return raw + b" " * (rng.randint(96, 160) << 20)


def _unescaped_label(raw: bytes, rng: random.Random) -> bytes:
    """A name holding a double quote and a backslash, written as Kineto writes a record_function's label."""
    return raw.replace(b'"name": "', b'"name": "say "hi" \\ to ', rng.randint(1, 50))


def _huge_number(raw: bytes, rng: random.Random) -> bytes:
    key = rng.choice([b'"dur": ', b'"t":', b'"wall_s":', b'"pid":', b'"schema_version": '])
    return raw.replace(key, key + b"9" * 5000 + b", \"was\": ", 1)


def _not_finite(raw: bytes, rng: random.Random) -> bytes:
    key = rng.choice([b'"dur": ', b'"t":', b'"wall_s":', b'"duration_s": ', b'"ts": '])
    return raw.replace(key, key + rng.choice([b"NaN", b"Infinity", b"-1e999"]) + b", \"was\": ", 1)


def _negative(raw: bytes, rng: random.Random) -> bytes:
    return raw.replace(b'"dur": ', b'"dur": -' + str(rng.randint(1, 10**6)).encode() + b', "was": ', 5)


def _not_objects(raw: bytes, rng: random.Random) -> bytes:
    return raw + rng.choice([b"null\n", b"{}\n", b"[]\n", b"7\n", b'"text"\n'])


def _not_utf8(raw: bytes, rng: random.Random) -> bytes:
    at = rng.randrange(len(raw))
    return raw[:at] + b"\xff\xfe\xfa" + raw[at:]


def _padded(raw: bytes, rng: random.Random) -> bytes:
    return raw + b" " * (rng.randint(1, 16) << 20)  # up to 16 MB of blanks, a few kB once gzipped


MUTATIONS: dict[str, Callable[[bytes, random.Random], bytes]] = {
    "truncate": _truncate, "flip": _flip, "wrong_type": _wrong_type, "deep": _deep, "huge_number": _huge_number,
    "not_finite": _not_finite, "negative": _negative, "not_objects": _not_objects, "not_utf8": _not_utf8,
    "padded": _padded, "deep_value": _deep_value, "bomb": _bomb, "unescaped_label": _unescaped_label,
}


def _mutate(path: Path, mutation: str, rng: random.Random) -> None:
    if mutation == "delete":
        path.unlink()
        return
    packed = path.suffix == ".gz"
    raw = gzip.decompress(path.read_bytes()) if packed else path.read_bytes()
    raw = MUTATIONS[mutation](raw, rng)
    path.write_bytes(gzip.compress(raw, 1) if packed else raw)


def _cases(root: Path, rng: random.Random) -> list[tuple[str, Path, Path]]:
    """(what, the path to analyse, where its findings.json goes) for each case."""
    cases = []
    for mutation in [*MUTATIONS, "delete"]:
        for n in range(CASES_PER_KIND):
            name = rng.choice(FILES)
            bundle = root / f"bundle-{mutation}-{n}"
            shutil.copytree(BUNDLE, bundle)
            _mutate(bundle / name, mutation, rng)
            cases.append((f"{mutation} of {name}", bundle, bundle / "findings.json"))
            if mutation != "delete":
                trace_dir = root / f"trace-{mutation}-{n}"
                trace_dir.mkdir()
                shutil.copy(BUNDLE / "trace.json.gz", trace_dir / "trace.json.gz")
                _mutate(trace_dir / "trace.json.gz", mutation, rng)
                cases.append((f"{mutation} of a bare trace", trace_dir / "trace.json.gz", trace_dir / "findings.json"))
    return cases


def _problem(what: str, outcome: dict, findings: Path) -> str | None:
    status, said = outcome["status"], outcome["stderr"]
    if status == 65:
        lines = said.strip().splitlines()
        if len(lines) != 1 or not lines[0].startswith("gpudoctor: ") or "Traceback" in said:
            return f"{what}: exit 65 but not one sentence: {said!r}"
        return None
    if status not in (0, None):
        return f"{what}: exit {status}: {said.strip()[-300:]!r}"
    try:
        checked_findings(findings)
    except (AssertionError, ValueError, OSError) as exc:
        return f"{what}: exit 0 but findings.json is not valid: {exc}"
    return None


def test_mutated_bundles_and_traces_are_refused_in_one_sentence_or_read(tmp_path: Path) -> None:
    cases = _cases(tmp_path, random.Random(20261123))
    assert len(cases) >= 200
    command = [sys.executable, "-c", CAPPED.format(cap=MEMORY_CAP), str(Path(__file__).parent / "fuzz_driver.py"),
               str(SECONDS_PER_CASE), *(str(path) for _, path, _ in cases)]
    done = subprocess.run(command, env=env_with(), capture_output=True, text=True, timeout=600, cwd=tmp_path)
    outcomes = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(outcomes) == len(cases), f"the driver stopped after {len(outcomes)} cases: {done.stderr[-2000:]}"
    problems = [p for (what, _, findings), outcome in zip(cases, outcomes)
                if (p := _problem(what, outcome, findings)) is not None]
    assert not problems, "\n".join(problems[:20])
    statuses = {outcome["status"] for outcome in outcomes}
    assert 65 in statuses and 0 in statuses  # both kinds of outcome are exercised
