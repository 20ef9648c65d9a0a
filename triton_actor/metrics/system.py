"""Host CPU and memory gauges from /proc, and the GPU gauges through NVML where a GPU and pynvml exist.

Owner: the :class:`SystemSampler` of the process that serves ``/metrics``; its greenlet samples every
``--metrics-interval-ms`` (Triton updates these per interval too) and keeps the last values. Failure: a
/proc file that cannot be read leaves those gauges out; no NVML (no pynvml, no driver, no GPU) means no
GPU families at all, as Triton without GPUs.
"""

from __future__ import annotations

import logging
from typing import Any

import gevent

log = logging.getLogger(__name__)


def read_cpu_times(path: str = "/proc/stat") -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs together."""
    with open(path) as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait, as Triton counts it
    total = sum(fields[:8])  # guest time is already inside user/nice
    return total - idle, total


def read_memory(path: str = "/proc/meminfo") -> tuple[int, int]:
    """(total, used) bytes; used = MemTotal - MemAvailable."""
    info: dict[str, int] = {}
    with open(path) as f:
        for line in f:
            key, _, rest = line.partition(":")
            info[key] = int(rest.split()[0]) * 1024
    return info["MemTotal"], info["MemTotal"] - info.get("MemAvailable", info.get("MemFree", 0))


def _nvml() -> Any:
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        return pynvml if pynvml.nvmlDeviceGetCount() > 0 else None
    except Exception:  # noqa: BLE001 - no module, no driver or no GPU: no GPU gauges
        return None


class SystemSampler:
    """The latest host gauges: ``values`` maps a family name to ``[(labels, value), ...]``."""

    def __init__(self, interval_s: float, cpu: bool = True, gpu: bool = True) -> None:
        """``cpu`` / ``gpu`` False: those families are never sampled (--allow-cpu-metrics, --allow-gpu-metrics;
        without GPU metrics NVML is not even initialised)."""
        self.interval_s = interval_s
        self.cpu = cpu
        self.values: dict[str, list[tuple[dict[str, str], float]]] = {}
        self._last_cpu: tuple[int, int] | None = None
        self._nvml = _nvml() if gpu else None
        self._greenlet: gevent.Greenlet | None = None

    def start(self) -> None:
        self.sample()
        self._greenlet = gevent.spawn(self._loop)

    def stop(self) -> None:
        if self._greenlet is not None:
            self._greenlet.kill(block=False)

    def _loop(self) -> None:
        while True:
            gevent.sleep(self.interval_s)  # the sampling period itself, not a synchronisation
            self.sample()

    def sample(self) -> None:
        values: dict[str, list[tuple[dict[str, str], float]]] = {}
        if self.cpu:
            self._sample_cpu(values)
        if self._nvml is not None:
            values.update(self._gpu())
        self.values = values

    def _sample_cpu(self, values: dict[str, list[tuple[dict[str, str], float]]]) -> None:
        try:
            busy, total = read_cpu_times()
            if self._last_cpu is not None and total > self._last_cpu[1]:
                util = (busy - self._last_cpu[0]) / (total - self._last_cpu[1])
                values["nv_cpu_utilization"] = [({}, max(0.0, min(1.0, util)))]
            else:
                values["nv_cpu_utilization"] = self.values.get("nv_cpu_utilization", [({}, 0.0)])
            self._last_cpu = (busy, total)
            mem_total, mem_used = read_memory()
            values["nv_cpu_memory_total_bytes"] = [({}, float(mem_total))]
            values["nv_cpu_memory_used_bytes"] = [({}, float(mem_used))]
        except (OSError, ValueError, IndexError, KeyError) as e:
            log.debug("metrics: /proc not readable: %s", e)

    def _gpu(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        nv = self._nvml
        out: dict[str, list[tuple[dict[str, str], float]]] = {}
        try:
            for i in range(nv.nvmlDeviceGetCount()):
                h = nv.nvmlDeviceGetHandleByIndex(i)
                uuid = nv.nvmlDeviceGetUUID(h)
                labels = {"gpu_uuid": uuid.decode() if isinstance(uuid, bytes) else uuid}
                mem = nv.nvmlDeviceGetMemoryInfo(h)
                for name, value in (
                    ("nv_gpu_utilization", nv.nvmlDeviceGetUtilizationRates(h).gpu / 100.0),
                    ("nv_gpu_memory_total_bytes", float(mem.total)),
                    ("nv_gpu_memory_used_bytes", float(mem.used)),
                    ("nv_gpu_power_usage", nv.nvmlDeviceGetPowerUsage(h) / 1000.0),
                    ("nv_gpu_power_limit", nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0),
                    ("nv_energy_consumption", nv.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0),
                ):
                    out.setdefault(name, []).append((labels, value))
        except Exception as e:  # noqa: BLE001 - a GPU that stops answering: no GPU gauges this round
            log.debug("metrics: NVML read failed: %s", e)
            return {}
        return out
