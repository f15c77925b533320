"""Analysis: a run bundle parsed once into typed, cached views (see `Run`).

A rule reads `Run` and the view types re-exported here (`from gpudoctor.analysis import Step, LoaderInfo`);
most are defined in `gpudoctor.analysis.views`. `MOVED` names the members rules once read on the run itself and the
view each now lives on; the old names still answer, with a `RunNameMoved` warning.
"""

from gpudoctor.analysis.batch_growth import BatchGrowth
from gpudoctor.analysis.budget import Budget
from gpudoctor.analysis.call_sites import CallSites
from gpudoctor.analysis.compiles import Compiles, GraphBreak, Recompiles
from gpudoctor.analysis.cpu_wait import CpuWait, cpu_wait_evidence
from gpudoctor.analysis.data_wait import DataWait
from gpudoctor.analysis.frameworks import batch_setting, compile_setting, loader_setting, settings_location
from gpudoctor.analysis.fusion import Fusion
from gpudoctor.analysis.gpu import GpuView
from gpudoctor.analysis.gpu_memory import GpuMemory, OutOfMemory, gpu_memory, out_of_memory
from gpudoctor.analysis.gpu_work import GpuWork, Launches
from gpudoctor.analysis.host_view import HostView
from gpudoctor.analysis.job_time import JobTime
from gpudoctor.analysis.loader_cpu import (
    LoadingTime,
    cores_per_rank,
    loader_limit_s,
    loader_workers,
    loading_time,
    worker_cpu_per_batch_s,
)
from gpudoctor.analysis.optimizers import OptimizerInfo, optimizer_share, optimizer_step_s
from gpudoctor.analysis.precision import Precision
from gpudoctor.analysis.run import MOVED, NotEvaluated, Run, RunNameMoved
from gpudoctor.analysis.settings import (
    FlagValue,
    PrecisionOption,
    Setting,
    call_of,
    flag_value,
    precision_option,
    setting_at,
)
from gpudoctor.analysis.stalls import Stall, Stalls
from gpudoctor.analysis.startup import PHASE_NAMES, Startup
from gpudoctor.analysis.step_view import StepView
from gpudoctor.analysis.throughput import Throughput
from gpudoctor.analysis.timebase import StepTime, paced_steps
from gpudoctor.analysis.trace import GpuOp
from gpudoctor.analysis.views import (
    CopySite,
    Env,
    Exit,
    ForkInfo,
    GilStats,
    LoaderInfo,
    LoaderView,
    Location,
    ProcessInfo,
    Samples,
    SeriesPoint,
    Step,
    SyncSite,
    ThreadInfo,
    WindowInfo,
)

__all__ = [
    "MOVED", "PHASE_NAMES", "BatchGrowth", "Budget", "CallSites", "Compiles", "CopySite", "CpuWait", "DataWait",
    "Env", "Exit", "FlagValue", "ForkInfo", "Fusion", "GilStats", "GpuMemory", "GpuOp", "GpuView", "GpuWork",
    "GraphBreak", "HostView", "JobTime", "Launches", "LoaderInfo", "LoaderView", "LoadingTime", "Location",
    "NotEvaluated", "OptimizerInfo", "OutOfMemory", "Precision", "PrecisionOption", "ProcessInfo", "Recompiles",
    "Run", "RunNameMoved", "Samples", "SeriesPoint", "Setting", "Stall", "Stalls", "Startup", "Step", "StepTime",
    "StepView", "SyncSite", "ThreadInfo", "Throughput", "WindowInfo", "batch_setting", "call_of", "compile_setting",
    "cores_per_rank", "cpu_wait_evidence", "flag_value", "gpu_memory", "loader_limit_s", "loader_setting",
    "loader_workers", "loading_time", "optimizer_share", "optimizer_step_s", "out_of_memory", "paced_steps",
    "precision_option", "setting_at", "settings_location", "worker_cpu_per_batch_s",
]
