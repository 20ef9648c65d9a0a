"""What the live status page shows: gathered per process, summed host-wide (host/base.py), as plain data.

:func:`local_status` is this process's ``"status"`` host handler (registered by the server): the repository
index (every model version with its state and reason) and, for each READY version, its scheduler's
:class:`~..actors.scheduling.scheduler.GetStatus` answer, and ``streams``: what streaming requests hold that their
clients have not taken yet (the server's :class:`~..runtime.response_channel.OpenStreams`). :func:`merge` sums the answers of every worker into what
``/status.json`` serves: counts and latency histograms are added first, then percentiles are read from
the summed histogram (percentiles of workers cannot be averaged).

Runs in a request greenlet (it asks the repository and scheduler actors); nothing here is on the
inference path. A version that stops while being asked is shown with its state and no live numbers.
"""

from __future__ import annotations

import time
from typing import Any

from ..actors.model.handles import READY
from ..errors import TritonError
from ..metrics.statistics import LATENCY_BUCKETS, percentile_ns
from ..runtime import gc_settle
from .dataplane import DataPlane
from .memory_budget import merge_status

_SUMMED = ("queued", "running", "busy_instances", "success", "fail", "inference_count", "execution_count",
           "success_ns", "queue_ns", "compute_ns")
PERCENTILES = (0.5, 0.9, 0.99)


def local_status(plane: DataPlane, _args: dict[str, Any] | None = None) -> dict[str, Any]:
    """This process's part (the ``"status"`` host handler)."""
    versions: list[dict[str, Any]] = []
    for entry in plane.repository_index(False):
        name, version = entry["name"], int(entry.get("version") or -1)
        row: dict[str, Any] = {"name": name, "version": version, "state": entry.get("state", ""),
                               "reason": entry.get("reason", "")}
        handle = plane.repository.routes.get(name)
        vh = handle.versions.get(version) if handle is not None else None
        if vh is not None and vh.state == READY and vh.scheduler is not None:
            try:
                row.update(_live(vh.live_status()))
            except TritonError:
                pass  # unloaded meanwhile: state and reason only
        versions.append(row)
    return {"worker": plane.host.worker_id, "live": plane.is_live(), "ready": plane.is_ready(),
            "time_ns": time.time_ns(), "versions": versions, "streams": plane.streams.totals(), "gc": gc_settle.status(),
            **({"memory_budget": plane.budget.status()} if plane.budget is not None else {}),
            **({"rate_limiter": plane.rate_limiter.status()} if plane.rate_limiter is not None else {}),
            **({"tune_report": report} if (report := plane.tune_report.status()) is not None else {})}


def _live(status: dict[str, Any]) -> dict[str, Any]:
    stats = status["stats"]
    durations = stats["durations"]
    return {
        "instances": status["instances"], "queued": status["queued"], "running": status["running"],
        "busy_instances": status["busy_instances"], "down_instances": status.get("down_instances", []),
        "success": durations["success"][0], "fail": durations["fail"][0],
        "success_ns": durations["success"][1], "queue_ns": durations["queue"][1],
        "compute_ns": sum(durations[k][1] for k in ("compute_input", "compute_infer", "compute_output")),
        "inference_count": stats["inference_count"], "execution_count": stats["execution_count"],
        "batches": {str(size): b[0] for size, b in stats["batches"].items()},
        "latency": stats["latency"],
    }


def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Every worker's part → one host-wide status (the first part's order and states)."""
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    for part in parts:
        for v in part["versions"]:
            key = (v["name"], v["version"])
            row = rows.get(key)
            if row is None:
                rows[key] = row = {**v, "instances": list(v.get("instances", [])),
                                   "down_instances": list(v.get("down_instances", [])), "batches": {},
                                   "latency": [0] * LATENCY_BUCKETS, "workers": 0}
                for k in _SUMMED:
                    row[k] = 0
            else:
                row["instances"] += v.get("instances", [])
                row["down_instances"] += v.get("down_instances", [])
            if "latency" not in v:
                continue
            row["workers"] += 1
            for k in _SUMMED:
                row[k] += v[k]
            for size, n in v["batches"].items():
                row["batches"][size] = row["batches"].get(size, 0) + n
            row["latency"] = [a + b for a, b in zip(row["latency"], v["latency"], strict=True)]
    versions = [_finish(row) for row in rows.values()]
    return {"live": all(p["live"] for p in parts), "ready": all(p["ready"] for p in parts),
            "workers": len(parts), "time_ns": max(p["time_ns"] for p in parts),
            "success": sum(v["success"] for v in versions), "fail": sum(v["fail"] for v in versions),
            "versions": versions, "streams": _sum_streams([p.get("streams", {}) for p in parts]),
            "gc": [p.get("gc", {}) for p in parts],
            # the host's: every worker's share added up
            **({"memory_budget": merge_status([p["memory_budget"] for p in parts if "memory_budget" in p])}
               if "memory_budget" in parts[0] else {}),
            # per worker: which resources it holds now, which of its instances wait (the host's units are shared)
            **({"rate_limiter": [{"worker": p["worker"], **p["rate_limiter"]} for p in parts]}
               if "rate_limiter" in parts[0] else {}),
            # every worker was told the same folder (host.broadcast); a worker started since was not
            **next(({"tune_report": p["tune_report"]} for p in parts if "tune_report" in p), {})}


def _sum_streams(parts: list[dict[str, int]]) -> dict[str, int]:
    """Every worker's undelivered streamed responses added up (the bounds are per request, not summed)."""
    total = {k: sum(p.get(k, 0) for p in parts) for k in ("open", "responses", "bytes", "waiting_senders")}
    return {**total, **{k: max((p.get(k, 0) for p in parts), default=0) for k in ("max_responses", "max_bytes")}}


def _finish(row: dict[str, Any]) -> dict[str, Any]:
    latency = row.pop("latency")
    n = row["success"]
    row["latency_ms"] = {f"p{round(q * 100)}": percentile_ns(latency, q) / 1e6 for q in PERCENTILES}
    row["latency_ms"]["mean"] = row["success_ns"] / n / 1e6 if n else 0.0
    row["batches"] = dict(sorted(row["batches"].items(), key=lambda kv: int(kv[0])))
    return row
