"""deploy/ and the Dockerfile: Kubernetes' own schemas (kubernetes-validate, strict), KServe's ServingRuntime
schema (deploy/schemas, jsonschema), and the facts the files must agree on (ports, probes, user, flags)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.unit.helm_subset import render_chart, render_template
from triton_actor import cli

kubernetes_validate = pytest.importorskip("kubernetes_validate")
from kubernetes_validate import utils as kv_utils  # noqa: E402
from referencing import Registry, Resource  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "kubernetes"
SERVING_RUNTIME = ROOT / "deploy" / "kserve" / "servingruntime.yaml"
KUBERNETES_VERSION = "1.37"
MANIFESTS = sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


def _load(path: Path) -> dict[str, Any]:
    (doc,) = [d for d in yaml.safe_load_all(path.read_text()) if d]
    return doc


def _by_kind() -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in map(_load, MANIFESTS)}


def _k8s_validate(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_is_valid_kubernetes(path: Path) -> None:
    _k8s_validate(_load(path))


def test_the_validator_cli_accepts_every_manifest() -> None:
    exe = Path(sys.executable).with_name("kubernetes-validate")
    run = subprocess.run([str(exe), "--strict", "-k", KUBERNETES_VERSION, *map(str, MANIFESTS)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("passed") == len(MANIFESTS)


def test_strict_validation_catches_a_misspelled_field() -> None:
    """The check can fail: a typo in a probe is refused, as kubectl --validate=strict would."""
    deployment = copy.deepcopy(_by_kind()["Deployment"])
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["livenesProbes"] = container.pop("livenessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        _k8s_validate(deployment)


def test_kustomization_lists_every_manifest() -> None:
    assert sorted(_load(K8S / "kustomization.yaml")["resources"]) == [p.name for p in MANIFESTS]


# -- KServe ServingRuntime ---------------------------------------------------------------------------
@cache
def _serving_runtime_validator() -> jsonschema.protocols.Validator:
    schema = json.loads((ROOT / "deploy" / "schemas" / "kserve-servingruntime-v1alpha1.json").read_text())
    defs = kv_utils.schema_contents(f"kubernetes-json-schema/v{KUBERNETES_VERSION}.0-local-strict/_definitions.json",
                                    KUBERNETES_VERSION)
    registry = Resource.from_contents(defs) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.Draft202012Validator(schema, registry=registry)


def _serving_runtime_errors(doc: dict[str, Any]) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
            for e in _serving_runtime_validator().iter_errors(doc)]


def test_serving_runtime_matches_kserve_schema() -> None:
    assert _serving_runtime_errors(_load(SERVING_RUNTIME)) == []


@pytest.mark.parametrize("break_it", [
    lambda d: d["spec"]["containers"][0].update(imagee="x"),  # core/v1 Container, strict
    lambda d: d["spec"]["supportedModelFormats"][0].update(priority=0),  # minimum 1
    lambda d: d["spec"].pop("containers"),
    lambda d: d["spec"].update(protocolVersion=["v2"]),  # not a field
])
def test_serving_runtime_schema_catches_mistakes(break_it: Any) -> None:
    doc = copy.deepcopy(_load(SERVING_RUNTIME))
    break_it(doc)
    assert _serving_runtime_errors(doc)


# -- what the files must agree on --------------------------------------------------------------------
def _dockerfile() -> dict[str, list[str]]:
    """Instruction → its arguments (the last occurrence), continuation lines joined."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out[word.upper()] = [rest.strip()]
    return out


def _exec_form(text: str) -> list[str]:
    value = json.loads(text)
    assert isinstance(value, list), f"not the exec form: {text}"
    return value


def test_dockerfile_matches_the_package_and_the_manifests() -> None:
    docker = _dockerfile()
    assert docker["FROM"][0].startswith("python:") and docker["FROM"][0].endswith("-slim")
    assert _exec_form(docker["ENTRYPOINT"][0]) == ["triton-actor"]
    assert "triton-actor = triton_actor.cli:main" in (ROOT / "setup.cfg").read_text()
    cli.parse(_exec_form(docker["CMD"][0]), environ={})  # the default arguments are real flags
    user = docker["USER"][0]
    pod = _by_kind()["Deployment"]["spec"]["template"]["spec"]
    assert user.isdigit() and int(user) != 0 and int(user) == pod["securityContext"]["runAsUser"]
    container = pod["containers"][0]
    assert sorted(map(int, docker["EXPOSE"][0].split())) == sorted(p["containerPort"] for p in container["ports"])
    health = docker["HEALTHCHECK"][0]
    assert "--start-period" in health and "/v2/health/ready" in health and "127.0.0.1:8000" in health
    assert "pip install" in docker["RUN"][0]


def test_deployment_service_and_probes_agree() -> None:
    kinds = _by_kind()
    pod = kinds["Deployment"]["spec"]["template"]
    container = pod["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8000, "grpc": 8001, "metrics": 8002}
    settings = cli.parse(container["args"], environ={})
    assert (settings.http_port, settings.grpc_port, settings.metrics_port) == (8000, 8001, 8002)
    assert settings.remote_repositories == ("s3://models/triton",) and settings.model_control_mode == "poll"
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(ports["metrics"])
    service = kinds["Service"]["spec"]
    assert service["selector"].items() <= pod["metadata"]["labels"].items()
    assert {p["name"]: (p["port"], p["targetPort"]) for p in service["ports"]} == {
        name: (port, name) for name, port in ports.items()}


def test_hpa_scales_the_deployment_on_the_adapter_metric() -> None:
    kinds = _by_kind()
    hpa = kinds["HorizontalPodAutoscaler"]["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                     "name": kinds["Deployment"]["metadata"]["name"]}
    (metric,) = hpa["metrics"]
    assert metric["type"] == "Pods" and metric["pods"]["metric"]["name"] == "nv_inference_pending_request_count"
    (rule,) = yaml.safe_load(kinds["ConfigMap"]["data"]["config.yaml"])["rules"]
    assert rule["name"]["as"] == metric["pods"]["metric"]["name"]
    assert rule["seriesQuery"].startswith("nv_inference_pending_request_count{")
    assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}


def test_serving_runtime_arguments_are_real_flags() -> None:
    container = _load(SERVING_RUNTIME)["spec"]["containers"][0]
    settings = cli.parse(container["args"], environ={})
    assert settings.http_port == container["ports"][0]["containerPort"] == 8080  # KServe's HTTP port
    assert settings.grpc_port == 9000 and str(settings.model_repositories[0]) == "/mnt/models"


# -- the Helm chart (rendered by tests/unit/helm_subset.py: helm itself is not installable here) -----------
CHART = ROOT / "deploy" / "helm" / "triton-actor"


def _rendered(**kwargs: Any) -> dict[str, dict[str, Any]]:
    docs = [yaml.safe_load(text) for text in render_chart(CHART, **kwargs).values()]
    return {d["kind"]: d for d in docs if d}


def test_chart_renders_valid_kubernetes_that_equals_the_plain_manifests() -> None:
    """With its default values and release name, the chart is exactly deploy/kubernetes (minus the adapter
    rule, which belongs to the Prometheus adapter's release)."""
    rendered = _rendered(release="triton-actor")
    for doc in rendered.values():
        _k8s_validate(doc)
    plain = _by_kind()
    plain.pop("ConfigMap")
    assert rendered == plain


def test_chart_values_reach_the_manifests() -> None:
    rendered = _rendered(release="edge", values={
        "modelRepository": "gs://bucket/repo", "extraArgs": ["--log-verbose=1", "--strict-readiness=false"],
        "image": {"tag": "9.9"}, "autoscaling": {"enabled": False}, "resources": {"limits": {"cpu": "3"}}})
    assert "HorizontalPodAutoscaler" not in rendered
    for doc in rendered.values():
        _k8s_validate(doc)
    container = rendered["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "triton-actor:9.9"  # values merge deeply, as helm merges them
    assert container["resources"]["limits"] == {"memory": "4Gi", "cpu": "3"}
    settings = cli.parse(container["args"], environ={})
    assert settings.remote_repositories == ("gs://bucket/repo",) and settings.log_verbose == 1
    assert settings.strict_readiness is False
    assert rendered["Service"]["spec"]["selector"] == {"app.kubernetes.io/name": "edge"}


def test_the_renderer_refuses_what_it_does_not_know() -> None:
    with pytest.raises(ValueError):
        render_template("{{ include \"x\" . }}", {})
    with pytest.raises(ValueError):
        render_template("{{ range .Values.x }}", {"Values": {"x": [1]}})
    assert render_template("a:\n  {{- if .V }}\n  b: {{ .V | quote }}\n  {{- end }}\n", {"V": 'x"y'}) == \
        'a:\n  b: "x\\"y"\n'
