"""How fixes are tried (gpudoctor.trying.tries): what the command line sets, importable without the rest."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TrySettings:
    steps: int | None = None  # steps each try runs (None: the diagnosed run's, at most STEPS_AFTER_WINDOW more)
    timeout_s: float | None = None  # each try's limit (None: twice the diagnosed run's time, at least a minute)
    finding: str | None = None  # only the findings whose code starts with this
    numerics: bool = False  # --try-fixes=all: also the fixes that change the numerics (gpudoctor.remedy.TIERS)
