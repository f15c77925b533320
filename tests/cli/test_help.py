"""`--help` of every command, as printed at 80 and 120 columns: whole summaries, usage lines and option types in
words."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from conftest import env_with

pytestmark = pytest.mark.e2e  # every test here starts processes

COMMANDS = ("profile", "analyze", "rules")
RULES_COMMANDS = ("list", "explain", "new")
OPTION_TYPES = {
    "profile": ["-m, --module MODULE", "--out DIR", "--wait-steps N", "--warmup-steps N", "--active-steps N",
                "--max-steps N", "--timeout SECONDS", "--every DURATION", "--rules PATH", "--select PREFIX",
                "--ignore PREFIX", "--rule-option CODE.OPTION=VALUE", "--rule-timeout SECONDS",
                "--fail-on SEVERITY", "--format FORMATS"],
    "analyze": ["--out DIR", "--rules PATH", "--select PREFIX", "--ignore PREFIX", "--rule-option CODE.OPTION=VALUE",
                "--rule-timeout SECONDS", "--fail-on SEVERITY", "--format FORMATS"],
}


def _help(columns: int, *command: str) -> str:
    done = subprocess.run([sys.executable, "-m", "gpudoctor", *command, "--help"], env=env_with(COLUMNS=str(columns)),
                          capture_output=True, text=True, timeout=60, check=True)
    return done.stdout


def _section(text: str, title: str) -> dict[str, str]:
    """A help section's rows, each entry's name and its (unwrapped) text."""
    body = text.split(f"\n{title}:\n", 1)[1].split("\n\n", 1)[0]
    rows: dict[str, str] = {}
    name = ""
    for line in body.splitlines():
        match = re.match(r"  (\S+)\s{2,}(.*)", line)
        if match:
            name = match.group(1)
            rows[name] = match.group(2)
        else:
            rows[name] += " " + line.strip()
    return rows


@pytest.mark.parametrize("columns", [80, 120])
def test_every_command_has_a_whole_one_line_summary(columns: int) -> None:
    for command, names in (((), COMMANDS), (("rules",), RULES_COMMANDS)):
        rows = _section(_help(columns, *command), "Commands")
        assert set(names) <= set(rows), rows
        for name in rows:  # every command listed, those added later too
            assert rows[name].endswith(".") and "..." not in rows[name] and "…" not in rows[name], rows
        for name in names:  # on one line, even at 80 columns
            assert rows[name].count(".") == 1 and rows[name].endswith(".") and len(rows[name]) <= columns - 13, rows
    summary = _section(_help(columns), "Commands")["profile"]
    assert "SCRIPT [ARGS]" not in summary and "GPU" in summary


@pytest.mark.parametrize("columns", [80, 120])
def test_usage_lines_name_the_arguments(columns: int) -> None:
    assert "profile [OPTIONS] SCRIPT [ARGS]...\n" in _help(columns, "profile")
    assert "analyze [OPTIONS] PATH...\n" in _help(columns, "analyze")
    assert "rules explain [OPTIONS] CODE\n" in _help(columns, "rules", "explain")
    assert "rules new [OPTIONS] CODE\n" in _help(columns, "rules", "new")


@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize("command", ["profile", "analyze", "rules explain", "rules new", "rules list"])
def test_option_types_are_words(columns: int, command: str) -> None:
    text = _help(columns, *command.split())
    assert not re.search(r"<(?:int|float|str|path|bool|list\[\w+\]|\w+ range)>", text), text  # typer's own
    assert not re.search(r"\{\w+\}|\[script\]", text), text
    flat = " ".join(text.split())
    for option in OPTION_TYPES.get(command, []):
        assert option in flat, option


def test_profile_help_says_where_gpudoctors_options_go() -> None:
    text = " ".join(_help(100, "profile").split())
    assert "gpudoctor's options go before SCRIPT: everything after it is the script's own." in text


@pytest.mark.parametrize("argv", [["--help"], ["analyze", "--help"], ["rules", "new", "--help"], ["diff", "--help"]])
def test_help_answers_without_importing_the_analysis(argv: list[str]) -> None:
    """The help of every command comes from the command line's own modules: the analysis, the engine, the rules and
    the report are imported by a command when it runs, so that `gpudoctor --help` answers at once."""
    probe = ("import sys\nfrom gpudoctor.cli import main\nsys.argv = ['gpudoctor', *sys.argv[1:]]\n"
             "try:\n    main()\nexcept SystemExit:\n    pass\n"
             "heavy = sorted(m for m in sys.modules if m.split('.')[:2] in (['gpudoctor', 'analysis'], "
             "['gpudoctor', 'engine'], ['gpudoctor', 'report'], ['gpudoctor', 'diagnose'], ['gpudoctor', 'rules']))\n"
             "print('imported:', heavy, file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, timeout=60,
                          check=True)
    assert "Usage:" in done.stdout
    assert "imported: []" in done.stderr


@pytest.mark.parametrize(("argv", "own"), [(["analyze", "--help"], "analyze"), (["diff", "--help"], "analyze"),
                                           (["rules", "list"], "rules"), (["try", "--help"], "tries"),
                                           (["--help"], None), (["analzye"], None)])
def test_a_command_line_imports_its_own_commands_module_alone(argv: list[str], own: str | None) -> None:
    """typer reads the options of every command it holds on each run: a command line that names a command registers
    that one's module alone; any other (the whole help, a misspelt command that typer suggests a name for) all."""
    probe = ("import sys\nfrom gpudoctor.cli import main\nsys.argv = ['gpudoctor', *sys.argv[1:]]\n"
             "try:\n    main()\nexcept SystemExit:\n    pass\n"
             "print('commands:', sorted(m.split('.')[2] for m in sys.modules if m.startswith('gpudoctor.cli.') and "
             "m.split('.')[2] in ('analyze', 'profile', 'tries', 'rules')), file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, timeout=60)
    expected = [own] if own else ["analyze", "profile", "rules", "tries"]
    assert f"commands: {expected}" in done.stderr, done.stderr
    assert ("Did you mean 'analyze'?" in done.stderr) == (argv == ["analzye"])
