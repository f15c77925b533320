"""The pipeline below every command: what to analyse, its diagnosis (a run's or a job's), its fixes tried, and its
report written.

    diagnosis = diagnose(paths, prepare_rules(RuleSelection()))   # a run or a job: chosen here, once
    diagnosis = try_fixes(diagnosis, TrySettings(), say)          # --try-fixes: `tried` on each finding
    write(diagnosis, out_dir, ("json", "html"))                   # the report, built now from the findings

The command line parses its arguments and calls these; `diffing` compares two runs with them.
"""

from __future__ import annotations

from gpudoctor.engine.project import (
    PreparedRules,
    RuleSelection,
    load_project_rules,
    prepare_rules,
    refuse_project_inside,
)
from gpudoctor.pipeline.diagnosis import Diagnosis, confirm_tries, diagnose, diagnose_run, fails, try_fixes
from gpudoctor.pipeline.inputs import analysis_inputs, is_job, open_run
from gpudoctor.pipeline.writing import FORMATS, Written, report_of, write, write_files

__all__ = [
    "FORMATS", "Diagnosis", "PreparedRules", "RuleSelection", "Written", "analysis_inputs", "confirm_tries", "diagnose",
    "diagnose_run", "fails", "is_job", "load_project_rules", "open_run", "prepare_rules", "refuse_project_inside",
    "report_of", "try_fixes", "write", "write_files",
]
