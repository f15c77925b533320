"""How numbers read in the report: seconds, shares, counts. Formatting only."""

from __future__ import annotations


def seconds(value: float | None) -> str:
    if value is None:
        return "—"
    if value >= 1:
        return f"{value:.2f} s"
    if value >= 1e-3:
        return f"{value * 1e3:.1f} ms"
    return f"{value * 1e6:.0f} µs"


def elapsed(value: float | None) -> str:
    """Time into the run: 42 s, 12 min 05 s, 3 h 20 min."""
    if value is None:
        return "—"
    total = round(value)
    if total < 60:
        return f"{total} s"
    if total < 3600:
        return f"{total // 60} min {total % 60:02d} s"
    return f"{total // 3600} h {total % 3600 // 60:02d} min"


def percent(value: float | None) -> str:
    return "—" if value is None else f"{value:.0%}"


def number(value: float | None, unit: str = "") -> str:
    """A measured value with its unit: 3 significant digits are plenty for a chart's hover."""
    if value is None:
        return "not measured"
    text = f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return f"{text}{'%' if unit == '%' else (' ' + unit if unit else '')}"


def times(factor: float) -> str:
    """A speed-up to three significant digits at most: '1.8×', '20.4×', '128×'."""
    return f"{factor:.1f}×" if factor < 10 else f"{factor:.3g}×" if factor < 100 else f"{factor:.0f}×"


def step_after(step_s: float | None, saving_s: float | None) -> str:
    """What a fix would make of the step: '35.7 → ~17.1 ms/step (≈2.1×)'; empty when either is unknown."""
    if not step_s or saving_s is None:
        return ""
    after = max(step_s - saving_s, 0.0)
    speedup = f"≈{times(step_s / after)}" if after > 0 else "all of it"
    before, later = seconds(step_s), seconds(after)
    if before.endswith(" ms") and later.endswith(" ms"):
        before = before.removesuffix(" ms")
    return f"{before} → ~{later}/step ({speedup})"
