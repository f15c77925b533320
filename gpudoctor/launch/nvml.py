"""NVML, read from gpudoctor's own process: per-GPU utilization, memory, PCIe traffic, clocks and power.

A field the driver does not support is left out of the sample, never written as zero.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from gpudoctor.bundle.manifest import GpuInfo
from gpudoctor.bundle.samples import GpuEntry


class NvmlUnavailable(Exception):
    """NVML cannot be used on this machine; the message says why in one sentence."""


class Nvml:
    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError as exc:
            raise NvmlUnavailable(f"the nvidia-ml-py package is not installed ({exc})") from None
        self._nvml = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(f"NVML could not be initialized: {exc}") from None
        count = pynvml.nvmlDeviceGetCount()
        if count == 0:
            raise NvmlUnavailable("NVML found no GPU")
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]

    def _read(self, call: Callable[..., Any], *args: Any) -> Any:
        """call(*args), or None where the driver cannot answer."""
        try:
            return call(*args)
        except self._nvml.NVMLError:
            return None

    def describe(self) -> tuple[list[GpuInfo], str | None]:
        n = self._nvml
        driver = self._read(n.nvmlSystemGetDriverVersion)
        gpus = []
        for index, h in enumerate(self.handles):
            memory = self._read(n.nvmlDeviceGetMemoryInfo, h)
            gpus.append(GpuInfo(
                index=index, name=_text(self._read(n.nvmlDeviceGetName, h)),
                uuid=_text(self._read(n.nvmlDeviceGetUUID, h)),
                memory_total=memory.total if memory else None,
                pcie_gen=self._read(n.nvmlDeviceGetMaxPcieLinkGeneration, h),
                pcie_width=self._read(n.nvmlDeviceGetMaxPcieLinkWidth, h),
            ))
        return gpus, _text(driver)

    def sample(self, with_pcie: bool) -> list[GpuEntry]:
        return [self._sample_one(index, h, with_pcie) for index, h in enumerate(self.handles)]

    def _sample_one(self, index: int, h: Any, with_pcie: bool) -> GpuEntry:
        n = self._nvml
        util = self._read(n.nvmlDeviceGetUtilizationRates, h)
        memory = self._read(n.nvmlDeviceGetMemoryInfo, h)
        power = self._read(n.nvmlDeviceGetPowerUsage, h)
        pcie_tx = pcie_rx = None
        if with_pcie:  # each PCIe query measures over ~20 ms, so it is read less often
            pcie_tx = self._read(n.nvmlDeviceGetPcieThroughput, h, n.NVML_PCIE_UTIL_TX_BYTES)
            pcie_rx = self._read(n.nvmlDeviceGetPcieThroughput, h, n.NVML_PCIE_UTIL_RX_BYTES)
        return GpuEntry(
            gpu=index, util=util.gpu if util is not None else None, mem_util=util.memory if util is not None else None,
            mem_used=memory.used if memory is not None else None,
            sm_mhz=self._read(n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_SM),
            power_w=power / 1000.0 if power is not None else None, pcie_tx_kbs=pcie_tx, pcie_rx_kbs=pcie_rx,
        )

    def shutdown(self) -> None:
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlShutdown()


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value
