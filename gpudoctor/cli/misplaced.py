"""Where the command line of `gpudoctor profile` ends and the script's begins: `-m MODULE` ends gpudoctor's options,
and a script that refused its arguments is told which of them are gpudoctor's, with the command that puts them first.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

import typer
from typer.core import TyperOption

if TYPE_CHECKING:  # the click that typer uses, as the type checker sees it in the installed typer
    from typer._click.core import Command as _ClickCommand

    from gpudoctor.launch.profile import ProfileOutcome
    from gpudoctor.launch.request import ProfileRequest

PROFILE_ARGS = "gpudoctor.profile_args"  # the command line as typed, kept in the context's meta


def end_options_after_module(args: list[str], takes_value: set[str]) -> list[str]:
    """Insert `--` after `-m MODULE`, so that the module's own arguments are not read as gpudoctor's options."""
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--" or not arg.startswith("-"):
            return args  # the script comes first, and click stops reading options there by itself
        if arg in ("-m", "--module"):
            return args if i + 1 == len(args) else [*args[:i + 2], "--", *args[i + 2:]]
        if arg.startswith("--module=") or (arg.startswith("-m") and not arg.startswith("--")):
            return [*args[:i + 1], "--", *args[i + 1:]]
        i += 2 if arg in takes_value else 1
    return args


def profile_options(command: _ClickCommand) -> dict[str, bool]:
    """Each of profile's option names (--out, -m, ...) and whether it takes a value."""
    return {name: not p.is_flag for p in command.params if isinstance(p, TyperOption) for name in p.opts}


def misplaced_options(ctx: typer.Context, request: ProfileRequest, outcome: ProfileOutcome) -> str | None:
    """When the script refused its arguments (status 2) and gpudoctor's options are among them: where they go."""
    if outcome.ending != "exit" or outcome.exit_status != 2:
        return None
    options = profile_options(ctx.command)
    for name in ("-m", "--module"):  # a module is not an option of the script's run: it replaces the script
        options.pop(name)
    own, kept = _split_options(request.args, options)
    if not own:
        return None
    typed = ctx.meta[PROFILE_ARGS]
    before_args = typed[:len(typed) - len(request.args)]  # the script's arguments are the end of what was typed
    target = _target_start(before_args)  # the moved options go last before it, so that they win over earlier ones
    names = list(dict.fromkeys(option[0].split("=", 1)[0] for option in own))
    which = "is a gpudoctor option, which goes" if len(names) == 1 else "are gpudoctor options, which go"
    moved = [arg for option in own for arg in option]
    fixed = shlex.join(["gpudoctor", "profile", *before_args[:target], *moved, *before_args[target:], *kept])
    target_kind = "module" if request.module else "script"
    return (f"{request.module or request.script} exited with status 2; {_and(names)} {which} before the "
            f"{target_kind}: {fixed}")


def _target_start(before_args: list[str]) -> int:
    """Where SCRIPT, `-- SCRIPT` or `-m MODULE` starts among the arguments typed before the script's own."""
    last = len(before_args) - 1
    return last - 1 if last > 0 and before_args[last - 1] in ("--", "-m", "--module") else last


def _split_options(args: list[str], options: dict[str, bool]) -> tuple[list[list[str]], list[str]]:
    """gpudoctor's options among `args`, each with its value, and the arguments left."""
    own: list[list[str]] = []
    kept: list[str] = []
    i = 0
    while i < len(args):
        name = args[i].split("=", 1)[0]
        width = (2 if options[name] and "=" not in args[i] else 1) if name in options else 0
        if width:
            own.append(args[i:i + width])
        else:
            kept.append(args[i])
        i += width or 1
    return own, kept


def _and(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
