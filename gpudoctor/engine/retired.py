"""Retired rule codes: the rules gpudoctor removed, each with one sentence saying why and what replaces it.

A retired code is never given to another rule (a renamed rule keeps its old code as an alias instead), and a
setting that names one (--select, --ignore, a rule option, `rules explain`) is refused, so that it does not
silently select, ignore or configure nothing.
"""

from __future__ import annotations

from gpudoctor.errors import RuleLoadError

RETIRED: dict[str, str] = {}  # code -> why it was retired and what replaces it, in one sentence


def retired_codes() -> dict[str, str]:
    return dict(RETIRED)


def retired_reason(code: str) -> str | None:
    return RETIRED.get(code.upper())


def refuse_retired(code: str, origin: str, consequence: str) -> None:
    """Raise when `code` is retired: '<origin>: GD150 is a retired rule code and <consequence>. <why>'."""
    reason = retired_reason(code)
    if reason is not None:
        raise RuleLoadError(f"{origin}: {code.upper()} is a retired rule code and {consequence}. {reason}")
