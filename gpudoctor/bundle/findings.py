"""The records of findings.json: a finding, a rule that could not be evaluated, a rule that failed.

The engine makes them, the report and the command line read them, and `to_json()` gives each as findings.json
holds it (gpudoctor/schemas/findings.schema.json): the same keys, in the same order, typed by the TypedDicts
below (FindingJson, ...). `from_json()` reads one back and checks its types; a record that does not fit raises
BundleError.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, ClassVar, TypedDict, TypeVar, cast

import msgspec

from gpudoctor.errors import BundleError
from gpudoctor.remedy import Remedy

Share = Annotated[float, msgspec.Meta(ge=0, le=1)]  # of step time
EvidenceValue = str | int | float | bool | None
SettingValue = str | int | bool | None  # a setting a try changed, as the script's process had it

_Self = TypeVar("_Self", bound="_JsonRecord")


# -- the records as findings.json holds them (the schema's $defs) -------------------------------------
class EvidenceJson(TypedDict):
    name: str
    value: EvidenceValue
    unit: str | None


class LocationJson(TypedDict):
    file: str
    line: int
    function: str


class FindingWindowJson(TypedDict):
    index: int
    impact: float | None
    severity: str


class _FindingFields(TypedDict):
    code: str
    name: str
    category: str
    severity: str
    title: str
    impact: float | None
    impact_reason: str | None
    saving_s: float | None  # estimated seconds saved per step: impact x the run's step time (run.step_s)
    evidence: list[EvidenceJson]
    location: LocationJson | None
    fix: str
    count: int
    doc: str


class TriedChangeJson(TypedDict):
    rank: int | None
    setting: str
    before: SettingValue
    after: SettingValue


class _TriedFields(TypedDict):
    status: str  # measured | failed | not_applicable
    applied: str | None
    step_s: float | None
    speedup: float | None
    steps: int | None
    reason: str | None
    tier: str | None  # same | numerics (gpudoctor.remedy.TIERS); None for a finding without a remedy
    loss_delta: float | None  # how far the loss moved against the diagnosed run's, relative; None: not compared
    compile_s: float | None  # a try that compiles the model: the compile time, apart from the steps it times


class TriedJson(_TriedFields, total=False):
    changes: list[TriedChangeJson]  # only where the try read its settings back from its ranks' bundles
    fix_of: str  # only on a finding whose saving another finding's fix makes, and that fix was tried
    not_as_predicted: str  # only where the try changed more than the prediction assumes
    bundle: str  # only where the try ran: its run directory, relative to the diagnosed run's ("tries/GD313")
    workers_start_s: list[float]  # only for a try of the loader's workers: their start, diagnosed and tried


class FindingJson(_FindingFields, total=False):
    ranks: list[int]  # only in a torchrun job's merged findings, for a finding seen on some of its ranks
    counted_in: str  # only on a finding whose saving another counts: a job's straggler counts its slow rank's, a
    # larger fix's finding counts one whose fix it holds (bf16 autocast with TF32 counts TF32's)
    windows: list[FindingWindowJson]  # only for a run profiled in several windows
    remedy: dict[str, object]  # only for a finding whose fix gpudoctor can apply at run time (gpudoctor.remedy)
    tried: TriedJson  # only in a run whose fixes were tried (--try-fixes, gpudoctor try)


class NotEvaluatedJson(TypedDict):
    code: str
    name: str
    reason: str


class RuleErrorJson(TypedDict):
    code: str
    name: str
    source: str
    error: str
    traceback: str


# -- the records ----------------------------------------------------------------------------------------
class _JsonRecord(msgspec.Struct, kw_only=True, frozen=True):
    """A record with a plain-JSON form; keys unknown to this version (from a newer gpudoctor) are ignored."""

    what: ClassVar[str] = "record"  # how an error message calls it

    def _plain(self) -> dict[str, object]:
        """The fields, in their order, as plain JSON: each record's `to_json()` gives it its TypedDict above."""
        # enc_hook=str: an evidence value of another type is written as its text, as json.dumps(default=str) did
        return cast("dict[str, object]", msgspec.to_builtins(self, enc_hook=str))

    @classmethod
    def from_json(cls: type[_Self], data: Mapping[str, object]) -> _Self:
        try:
            return msgspec.convert(data, cls)
        except msgspec.ValidationError as exc:
            raise BundleError(f"findings.json: a {cls.what} is not valid: {_sentence(str(exc))}.") from None


def _sentence(message: str) -> str:
    """msgspec's 'Expected `int`, got `str` - at `$.count`' as part of one sentence."""
    return (message[:1].lower() + message[1:]).replace(" - at ", " at ")


class Evidence(_JsonRecord, kw_only=True, frozen=True):
    """One measurement behind a finding: `value` in `unit` (None for a count or a plain value)."""

    name: str
    value: EvidenceValue
    unit: str | None = None

    def to_json(self) -> EvidenceJson:
        return cast("EvidenceJson", self._plain())


class FindingLocation(_JsonRecord, kw_only=True, frozen=True):
    """The line in the user's code that causes a finding."""

    file: str
    line: int
    function: str = ""

    def to_json(self) -> LocationJson:
        return cast("LocationJson", self._plain())

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


class FindingWindow(_JsonRecord, kw_only=True, frozen=True):
    """How a finding looked in one profiling window of a run profiled with --every."""

    index: Annotated[int, msgspec.Meta(ge=0)]
    impact: Share | None
    severity: str

    def to_json(self) -> FindingWindowJson:
        return cast("FindingWindowJson", self._plain())


TRIED_STATUSES = ("measured", "failed", "not_applicable")


class TriedChange(_JsonRecord, kw_only=True, frozen=True):
    """One setting a try changed in one process: `before` as the diagnosed run had it, `after` as the try's own
    bundle has it (None: not set, or not seen). `rank`: the job's rank, None for a run of one process."""

    what: ClassVar[str] = "tried change"
    rank: Annotated[int, msgspec.Meta(ge=0)] | None = None
    setting: str
    before: SettingValue = None
    after: SettingValue = None

    def to_json(self) -> TriedChangeJson:
        return cast("TriedChangeJson", self._plain())


class Tried(_JsonRecord, kw_only=True, frozen=True):
    """A finding's fix, tried: the script run again with it applied (`applied`, in the script's terms; in a job,
    per rank: 'rank 0: num_workers 6 → 15; rank 1: 0 → 15'), and the step at that run's pace (`step_s`, over
    `steps` steps) with `speedup` = the diagnosed run's step over it; or why it failed or could not be tried
    (`reason`, one sentence). `changes`: each setting the try changed, per rank, as the try's bundle has it;
    `fix_of`: the finding whose fix this is, when it is another's (a straggler's, whose cause that finding names);
    `not_as_predicted`: how the try differs from the fix the finding's prediction assumes, and what each assumes.
    `tier`: whether the fix keeps the computation ("same", tried by --try-fixes) or changes its numerics
    ("numerics", tried only by --try-fixes=all); `loss_delta`: how far the loss handed to backward() moved over the
    steps both runs recorded, relative to the diagnosed run's (gpudoctor.trying.numerics); `compile_s`: for a fix
    that compiles the model, the seconds torch.compile took, reported apart from the steps timed after it;
    `bundle`: where the try ran, its run directory relative to the diagnosed run's; `workers_start_s`: for a fix of
    the loader's workers, the seconds their first start took in the diagnosed run and in the try's (a cost paid
    once, which the step does not show)."""

    what: ClassVar[str] = "tried fix"
    status: str
    applied: str | None = None
    step_s: Annotated[float, msgspec.Meta(gt=0)] | None = None
    speedup: Annotated[float, msgspec.Meta(gt=0)] | None = None
    steps: Annotated[int, msgspec.Meta(ge=0)] | None = None
    reason: str | None = None
    changes: list[TriedChange] | None = None
    fix_of: str | None = None
    not_as_predicted: str | None = None
    tier: str | None = None
    loss_delta: Annotated[float, msgspec.Meta(ge=0)] | None = None
    compile_s: Annotated[float, msgspec.Meta(ge=0)] | None = None
    bundle: str | None = None
    workers_start_s: list[Annotated[float, msgspec.Meta(ge=0)]] | None = None

    def to_json(self) -> TriedJson:
        plain = cast("TriedJson", self._plain())
        for key in ("changes", "fix_of", "not_as_predicted", "bundle", "workers_start_s"):  # only some tries
            if getattr(self, key) is None:
                del plain[key]  # type: ignore[misc]
        return plain


class FindingRecord(_JsonRecord, kw_only=True, frozen=True):
    """One finding: which rule, what it found, what it costs (`impact`, a share of step time, or None with
    `impact_reason`), the evidence, where, and the fix. `windows` is set only for a run with several windows,
    `ranks` only in a torchrun job's merged findings (the ranks it was seen on)."""

    what: ClassVar[str] = "finding"
    code: str
    name: str
    category: str
    severity: str
    title: str
    impact: Share | None
    impact_reason: str | None = None
    saving_s: Annotated[float, msgspec.Meta(ge=0)] | None = None  # impact x the run's step time (run.step_s)
    evidence: list[Evidence]
    location: FindingLocation | None
    fix: str
    count: Annotated[int, msgspec.Meta(ge=1)] = 1
    doc: str = ""
    ranks: list[Annotated[int, msgspec.Meta(ge=0)]] | None = None
    counted_in: str | None = None  # the code of the finding that counts this one's saving
    windows: list[FindingWindow] | None = None
    remedy: Remedy | None = None
    tried: Tried | None = None

    def to_json(self) -> FindingJson:
        plain = cast("FindingJson", self._plain())
        # Keys that only some findings.json have: a torchrun job's (ranks, counted_in), a run profiled in several
        # windows (windows), a finding whose fix can be applied at run time (remedy), a run whose fixes were tried
        # (tried).
        for key in ("ranks", "counted_in", "windows", "remedy", "tried"):
            if getattr(self, key) is None:
                del plain[key]  # type: ignore[misc]
        if self.tried is not None:
            plain["tried"] = self.tried.to_json()
        return plain


class NotEvaluatedRecord(_JsonRecord, kw_only=True, frozen=True):
    """A rule that could not run: the data it needs was not collected (`reason` says which)."""

    what: ClassVar[str] = "not-evaluated row"
    code: str
    name: str
    reason: str

    def to_json(self) -> NotEvaluatedJson:
        return cast("NotEvaluatedJson", self._plain())


class RuleErrorRecord(_JsonRecord, kw_only=True, frozen=True):
    """A rule that raised while it ran; the other rules still ran."""

    what: ClassVar[str] = "rule error row"
    code: str
    name: str
    source: str
    error: str
    traceback: str = ""

    def to_json(self) -> RuleErrorJson:
        return cast("RuleErrorJson", self._plain())
