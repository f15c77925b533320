"""What a try says beside its speed-up: how far it moved the loss, and how long compiling took apart from the steps
it timed (findings.json's tried.loss_delta and tried.compile_s, gpudoctor.trying.numerics)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# A fix of the tier that keeps the computation moves the loss only through what the fix does not decide: the
# script's randomness (an unseeded run, random samples drawn in loader workers instead of the main process) and the
# order float sums are rounded in (a fused optimizer).
SAME_TIER_NOTE = (" (this fix keeps the computation: the script's own randomness, such as random data drawn in "
                  "loader workers, or sums rounded in another order, moved it)")


def numerics_note(tried: Mapping[str, Any]) -> str:
    """'; the loss moved 0.15% from the diagnosed run's, compiling took 12.3 s apart', or empty."""
    parts = []
    delta = tried.get("loss_delta")
    if delta is not None:
        kept = SAME_TIER_NOTE if tried.get("tier") == "same" else ""
        parts.append("the loss did not move from the diagnosed run's" if delta == 0 else
                     f"the loss moved {delta:.2%} from the diagnosed run's{kept}")
    compile_s = tried.get("compile_s")
    if compile_s is not None:
        parts.append(f"compiling took {compile_s:.1f} s, before the steps timed")
    return "; " + ", ".join(parts) if parts else ""
