"""NVML, read from gpudoctor's own process: per-GPU utilization, memory, PCIe traffic, clocks and power.

A field the driver does not support is left out of the sample, never written as zero.
"""

from __future__ import annotations

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

    def _read(self, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except self._nvml.NVMLError:
            return None

    def describe(self) -> tuple[list[GpuInfo], str | None]:
        n = self._nvml
        driver = self._read(n.nvmlSystemGetDriverVersion)
        gpus = []
        for index, h in enumerate(self.handles):
            memory = self._read(lambda h=h: n.nvmlDeviceGetMemoryInfo(h))
            gpus.append(GpuInfo(
                index=index, name=_text(self._read(lambda h=h: n.nvmlDeviceGetName(h))),
                uuid=_text(self._read(lambda h=h: n.nvmlDeviceGetUUID(h))),
                memory_total=memory.total if memory else None,
                pcie_gen=self._read(lambda h=h: n.nvmlDeviceGetMaxPcieLinkGeneration(h)),
                pcie_width=self._read(lambda h=h: n.nvmlDeviceGetMaxPcieLinkWidth(h)),
            ))
        return gpus, _text(driver)

    def sample(self, with_pcie: bool) -> list[GpuEntry]:
        return [self._sample_one(index, h, with_pcie) for index, h in enumerate(self.handles)]

    def _sample_one(self, index: int, h: Any, with_pcie: bool) -> GpuEntry:
        n = self._nvml
        util = self._read(lambda: n.nvmlDeviceGetUtilizationRates(h))
        memory = self._read(lambda: n.nvmlDeviceGetMemoryInfo(h))
        power = self._read(lambda: n.nvmlDeviceGetPowerUsage(h))
        pcie: dict[str, float | None] = {}
        if with_pcie:  # each PCIe query measures over ~20 ms, so it is read less often
            for key, counter in (("pcie_tx_kbs", n.NVML_PCIE_UTIL_TX_BYTES), ("pcie_rx_kbs", n.NVML_PCIE_UTIL_RX_BYTES)):
                pcie[key] = self._read(lambda c=counter: n.nvmlDeviceGetPcieThroughput(h, c))
        return GpuEntry(
            gpu=index, util=util.gpu if util is not None else None, mem_util=util.memory if util is not None else None,
            mem_used=memory.used if memory is not None else None,
            sm_mhz=self._read(lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)),
            power_w=power / 1000.0 if power is not None else None, **pcie,
        )

    def shutdown(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError:
            pass


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value
