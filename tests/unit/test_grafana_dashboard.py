"""deploy/grafana's dashboard and deploy/prometheus*.yml without a server: the JSON is a Grafana dashboard
whose every panel has a query, every query reads only families we export (or Triton's cache families) and
uses only the dashboard's own variables, and Debian's promtool accepts every query and both scrape configs.
That each query returns data from a real server: tests/integration/test_grafana_dashboard.py."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.integration.prometheus import DASHBOARD, RATE_INTERVAL, SCRAPE_CONFIG, panels, substitute
from tests.unit.metrics.test_metrics_families import _entry
from triton_actor.metrics.config import MetricsConfig
from triton_actor.metrics.families import SYSTEM, model_families

ROOT = Path(__file__).resolve().parents[2]
K8S_JOB = ROOT / "deploy" / "prometheus-kubernetes.yml"
PROMTOOL = Path("/usr/bin/promtool")
# Triton's response-cache families (its docs/user_guide/metrics.md, "Response Cache Metrics")
TRITON_CACHE = {"nv_cache_num_hits_per_model", "nv_cache_num_misses_per_model", "nv_cache_hit_duration_per_model",
                "nv_cache_miss_duration_per_model"}
GRAFANA_BUILTINS = {"__rate_interval"}


def _dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def _exprs() -> list[str]:
    return [t["expr"] for p in panels(_dashboard()) for t in p["targets"]]


def _exported() -> set[str]:
    return {m.name for m in model_families([_entry(1)], MetricsConfig())} | set(SYSTEM)


def test_every_panel_has_a_query_on_the_dashboards_datasource() -> None:
    d = _dashboard()
    assert d["uid"] and d["title"] and isinstance(d["schemaVersion"], int)
    found = panels(d)
    assert len(found) >= 20
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    for p in found:
        assert p["targets"], p["title"]
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        assert all(t["expr"].strip() and t["datasource"]["uid"] == "${datasource}" for t in p["targets"]), p["title"]
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]


def test_panels_do_not_overlap() -> None:
    cells: dict[tuple[int, int], str] = {}
    for p in _dashboard()["panels"]:
        g = p["gridPos"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]


def test_queries_read_exported_families_and_defined_variables() -> None:
    d = _dashboard()
    defined = {v["name"] for v in d["templating"]["list"]} | GRAFANA_BUILTINS
    known = _exported() | TRITON_CACHE
    used = set()
    for expr in _exprs():
        names = set(re.findall(r"\bnv_\w+", expr))
        assert names and names <= known, (expr, names - known)
        used |= names
        assert set(re.findall(r"\$\{?(\w+)", expr)) <= defined, expr
    # what the issue asks each model and host to show has a panel
    assert {"nv_inference_request_success", "nv_inference_count", "nv_inference_request_failure",
            "nv_inference_queue_duration_us", "nv_inference_compute_infer_duration_us",
            "nv_inference_pending_request_count", "nv_cache_num_hits_per_model", "nv_cpu_utilization",
            "nv_cpu_memory_used_bytes", "nv_gpu_utilization", "nv_gpu_memory_used_bytes"} <= used


def test_variables_select_by_model_and_server() -> None:
    by_name = {v["name"]: v for v in _dashboard()["templating"]["list"]}
    assert by_name["datasource"]["type"] == "datasource" and by_name["datasource"]["query"] == "prometheus"
    for name in ("model", "instance"):
        assert by_name[name]["multi"] and by_name[name]["includeAll"] and by_name[name]["allValue"] == ".*"
    per_model = [e for e in _exprs() if "nv_inference" in e or "nv_cache" in e]
    assert all('model=~"$model"' in e for e in per_model)


def _promtool(*args: str) -> subprocess.CompletedProcess:
    assert PROMTOOL.exists(), "Debian's prometheus (promtool) is missing: run scripts/install_test_deps.sh"
    return subprocess.run([str(PROMTOOL), *args], capture_output=True, text=True, timeout=60)


@pytest.mark.host_tools
def test_promtool_accepts_every_query(tmp_path: Path) -> None:
    variables = {"model": ".*", "instance": ".*", "__rate_interval": RATE_INTERVAL}
    rules = [{"record": f"dashboard:query_{i}", "expr": substitute(e, variables)} for i, e in enumerate(_exprs())]
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = _promtool("check", "rules", str(path))
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.host_tools
def test_promtool_accepts_the_scrape_configs(tmp_path: Path) -> None:
    done = _promtool("check", "config", str(SCRAPE_CONFIG))
    assert done.returncode == 0, done.stdout + done.stderr
    # Debian's build has no Kubernetes discovery: check the pod job's relabelling with a static target instead
    k8s = yaml.safe_load(K8S_JOB.read_text())
    (job,) = k8s["scrape_configs"]
    assert job.pop("kubernetes_sd_configs") == [{"role": "pod"}]
    job["static_configs"] = [{"targets": ["pod:8002"]}]
    path = tmp_path / "k8s.yml"
    path.write_text(yaml.safe_dump(k8s))
    done = _promtool("check", "config", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    # prometheus-adapter's rule (deploy/kubernetes) and the dashboard read these labels
    assert {"pod", "namespace", "instance"} <= {r.get("target_label") for r in job["relabel_configs"]}
