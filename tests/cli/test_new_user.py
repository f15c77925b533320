"""A new user's first mistakes are told in one sentence that says what to type instead.

gpudoctor's options after the script, a script that raises, a misspelt script name, and messages that never
read "gpudoctor: gpudoctor ...".
"""

from __future__ import annotations

import shlex

import pytest

from conftest import WINDOW, Gpudoctor, Result

ARGPARSE_SCRIPT = """\
import argparse
import sys

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=1)
parser.parse_args()
print("train: parsed", sys.argv[1:])
"""

RAISES = """\
import gpudoctor


def load():
    raise ValueError("bad batch")


for _ in range(4):
    gpudoctor.step()
load()
"""


@pytest.fixture
def train_py(gd: Gpudoctor) -> str:
    (gd.cwd / "train.py").write_text(ARGPARSE_SCRIPT)
    return "train.py"


def _suggested(result: Result) -> list[str]:
    """The command the message suggests, as arguments of `python -m gpudoctor`."""
    command = shlex.split(result.first_message.split(": ", 2)[2])
    assert command[:2] == ["gpudoctor", "profile"], result.first_message
    return command[1:]


# -- gpudoctor's options after the script ------------------------------------------------------------
def test_options_after_the_script_are_named_with_the_command_that_works(gd: Gpudoctor, train_py: str) -> None:
    result = gd.profile(train_py, "--max-steps", "12", "--out", "run", options=(), out=None)
    assert result.returncode == 2, result
    assert "unrecognized arguments: --max-steps 12 --out run" in result.stderr  # the script's own message
    assert result.first_message == (
        "gpudoctor: train.py exited with status 2; --max-steps and --out are gpudoctor options, which go before the "
        "script: gpudoctor profile --max-steps 12 --out run train.py")
    # The run never reached a step: the hint is all gpudoctor says, and it writes no report.
    assert result.messages == [result.first_message], result
    assert "report:" not in result.stderr and "No training step" not in result.stderr, result
    assert not [*gd.cwd.glob("gpudoctor-runs/*/report.html"), *gd.cwd.glob("gpudoctor-runs/*/findings.json")]
    fixed = gd.run(*_suggested(result))
    assert fixed.returncode == 0, fixed
    assert "train: parsed []" in fixed.stdout
    assert fixed.manifest()["max_steps"] == 12 and (gd.cwd / "run" / "manifest.json").is_file()


def test_one_option_with_equals_and_a_flag_among_the_scripts_own(gd: Gpudoctor, train_py: str) -> None:
    result = gd.profile(train_py, "--epochs", "3", "--timeout=60", "--with-stack", options=WINDOW)
    assert result.returncode == 2, result
    assert result.first_message == (
        "gpudoctor: train.py exited with status 2; --timeout and --with-stack are gpudoctor options, which go before "
        "the script: gpudoctor profile --out run --wait-steps 1 --warmup-steps 1 --active-steps 2 --detail-steps 1 "
        "--timeout=60 "
        "--with-stack train.py --epochs 3")


def test_a_single_option_moved_after_options_given_before_the_script(gd: Gpudoctor, train_py: str) -> None:
    result = gd.run("profile", "--out", "run", "--", train_py, "--format", "json")
    assert result.returncode == 2, result
    assert result.first_message == (
        "gpudoctor: train.py exited with status 2; --format is a gpudoctor option, which goes before the script: "
        "gpudoctor profile --out run --format json -- train.py")


def test_options_after_a_module(gd: Gpudoctor) -> None:
    (gd.cwd / "trainmod.py").write_text(ARGPARSE_SCRIPT)
    result = gd.run("profile", "--out", "run", "-m", "trainmod", "--select", "GD1")
    assert result.returncode == 2, result
    assert result.first_message == (
        "gpudoctor: trainmod exited with status 2; --select is a gpudoctor option, which goes before the module: "
        "gpudoctor profile --out run --select GD1 -m trainmod")


@pytest.mark.parametrize(("args", "status"), [(("--bogus",), 2), (("--out", "x"), 3)])
def test_other_failures_keep_the_plain_sentence(gd: Gpudoctor, args: tuple[str, ...], status: int) -> None:
    """Status 2 without a gpudoctor option, or another status with one: nothing about gpudoctor's options."""
    (gd.cwd / "fails.py").write_text(f"import sys\nsys.exit({status})\n")
    result = gd.profile("fails.py", *args, options=())
    assert result.returncode == status, result
    assert result.first_message == f"gpudoctor: fails.py exited with status {status}."


# -- a script that raises ----------------------------------------------------------------------------
def test_the_verdict_names_the_exception_and_where_first(gd: Gpudoctor) -> None:
    (gd.cwd / "boom.py").write_text(RAISES)
    result = gd.profile("boom.py", options=WINDOW)
    assert result.returncode == 1, result
    raised = "boom.py raised ValueError at boom.py:5, in load: bad batch."
    verdict = result.findings()["summary"]["verdict"]
    assert verdict.startswith(raised + " "), verdict
    assert result.first_message == f"gpudoctor: {verdict}"  # the summary says it once, first
    assert verdict in (result.run_dir / "report.html").read_text()


RAISED_IN_TORCH = """\
import torch

import gpudoctor


def load_checkpoint():
    return torch.load("missing.pt")


for _ in range(4):
    gpudoctor.step()
load_checkpoint()
"""


def test_an_exception_torch_raises_is_told_at_the_users_line(gd: Gpudoctor) -> None:
    (gd.cwd / "resume.py").write_text(RAISED_IN_TORCH)
    result = gd.profile("resume.py", options=WINDOW)
    assert result.returncode == 1, result
    raised = ("gpudoctor: resume.py raised FileNotFoundError at resume.py:7, in load_checkpoint: "
              "[Errno 2] No such file or directory: 'missing.pt'. ")
    assert result.first_message.startswith(raised), result


def test_without_the_summary_the_ending_sentence_still_names_the_exception(gd: Gpudoctor) -> None:
    (gd.cwd / "boom.py").write_text(RAISES)
    result = gd.profile("boom.py", options=(*WINDOW, "--format", "json"))
    assert result.returncode == 1, result
    assert result.messages == ["gpudoctor: boom.py raised ValueError: bad batch"]


# -- a misspelt script -------------------------------------------------------------------------------
def test_a_missing_script_suggests_the_closest_one_beside_it(gd: Gpudoctor, train_py: str) -> None:
    (gd.cwd / "sub").mkdir()
    (gd.cwd / "sub" / "evaluate.py").write_text("")
    assert gd.profile("trian.py").messages == ["gpudoctor: trian.py does not exist; did you mean train.py?"]
    assert gd.profile("sub/evalute.py").messages == [
        "gpudoctor: sub/evalute.py does not exist; did you mean sub/evaluate.py?"]
    assert gd.profile("nothing_alike.py").messages == ["gpudoctor: nothing_alike.py does not exist."]
    assert gd.profile("trian.py").returncode == 2


# -- gpudoctor's own sentences -----------------------------------------------------------------------
def test_max_steps_sentence_does_not_repeat_the_name(gd: Gpudoctor) -> None:
    (gd.cwd / "loop.py").write_text("import gpudoctor\nwhile True:\n    gpudoctor.step()\n")
    result = gd.profile("loop.py", options=("--max-steps", "3", "--format", "json"))
    assert result.returncode == 0, result
    assert result.messages == ["gpudoctor: stopped loop.py after --max-steps 3, as asked."]
    assert not any(m.startswith("gpudoctor: gpudoctor") for m in result.messages)
