"""`gpudoctor`: the application with every command, and `main`, which catches gpudoctor's errors once and
prints each as its one sentence with its exit status."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated

import typer

from gpudoctor._version import __version__
from gpudoctor.errors import EXIT_INTERNAL, GpudoctorError

if TYPE_CHECKING:  # the click that typer uses, as the type checker sees it in the installed typer
    from typer._click.exceptions import ClickException as _ClickException
else:
    # Usage errors are raised by the click that typer uses, which recent typer versions vendor as typer._click.
    _ClickException = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")

from gpudoctor.cli.app import _say, app

# The module that registers each command, by the command's name.
COMMANDS = {"analyze": "gpudoctor.cli.analyze", "diff": "gpudoctor.cli.analyze", "profile": "gpudoctor.cli.profile",
            "try": "gpudoctor.cli.tries", "rules": "gpudoctor.cli.rules"}
COMMAND_MODULES = tuple(dict.fromkeys(COMMANDS.values()))


def register_commands(argv: list[str] | None = None) -> None:
    """Import the command modules: importing one registers its commands. A command line naming a command imports
    that command's module alone: `gpudoctor profile ...` starts the script before the other commands' imports (the
    analysis, the engine, the report), and typer reads the options of the commands it has, not of every one
    (30 ms of each `gpudoctor analyze`). Any other command line (--help, a misspelt command) imports them all."""
    import importlib

    own = COMMANDS.get(argv[0]) if argv else None
    for name in (own,) if own is not None else COMMAND_MODULES:
        importlib.import_module(name)


def _version(value: bool) -> None:
    if value:
        print(f"gpudoctor {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True, help="Show the version.")] = False) -> None:
    pass


def _usage_sentence(exc: _ClickException) -> str:
    """A usage error as one sentence, with the command's usage: 'give a script to run, or -m MODULE. Usage: gpudoctor
    profile [OPTIONS] SCRIPT [ARGS]... (`gpudoctor profile --help` says more).'"""
    message = exc.format_message().rstrip()
    message = message.removeprefix("Invalid value: ")
    if not message.endswith((".", "?", "!")):
        message += "."
    ctx = getattr(exc, "ctx", None)
    if ctx is None:
        return message
    usage = " ".join(ctx.get_usage().split())
    return f"{message} {usage} (`{ctx.command_path} --help` says more)."


def main() -> None:
    if sys.argv[1:2] == ["profile"]:
        from gpudoctor.launch import prestart

        prestart.begin(sys.argv[2:])  # the script's interpreter starts while the command line is read
    register_commands(sys.argv[1:])
    try:
        # Outside standalone mode click returns a typer.Exit's code instead of exiting with it.
        status = app(standalone_mode=False)
    except GpudoctorError as exc:
        _say(str(exc))
        sys.exit(exc.exit_status)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        _say("aborted.")
        sys.exit(130)
    except _ClickException as exc:  # usage errors
        _say(_usage_sentence(exc))
        sys.exit(exc.exit_code)
    except Exception as exc:  # noqa: BLE001 - a bug in gpudoctor: one line, the traceback and EXIT_INTERNAL
        _say(f"internal error: {type(exc).__name__}: {exc}. Please report it with the traceback below.")
        import traceback

        traceback.print_exc()
        sys.exit(EXIT_INTERNAL)
    sys.exit(status if isinstance(status, int) else 0)
