"""deploy/: the Kubernetes manifests against the Kubernetes API schemas (kubernetes-validate,
which ships them, so this runs offline), the systemd unit, and the Grafana dashboard's shape.
Whether the dashboard's metrics exist is checked against a real server in
tests/e2e/test_metrics.py."""

import copy
import json
import os
import re
import shlex
import shutil
import subprocess

import jsonschema
import kubernetes_validate
import pytest
import referencing
import yaml

from shmserve.host.cli import parse_options
from tests.conftest import ROOT

DEPLOY = os.path.join(ROOT, "deploy")
KUBERNETES = os.path.join(DEPLOY, "kubernetes")
UNIT = os.path.join(DEPLOY, "systemd", "shmserve.service")
# The oldest Kubernetes the manifests are for (the preStop sleep action is 1.30's).
KUBERNETES_VERSION = "1.30.0"


def manifests() -> dict:
    """{kind: resource} of every document in deploy/kubernetes/."""
    out = {}
    for name in sorted(os.listdir(KUBERNETES)):
        with open(os.path.join(KUBERNETES, name)) as f:
            for doc in yaml.safe_load_all(f):
                assert doc["kind"] not in out, f"two {doc['kind']} in deploy/kubernetes"
                out[doc["kind"]] = doc
    return out


@pytest.mark.parametrize("kind", ["Deployment", "Service", "HorizontalPodAutoscaler",
                                  "ConfigMap"])
def test_manifest_matches_the_kubernetes_schema(kind):
    kubernetes_validate.validate(manifests()[kind], KUBERNETES_VERSION, strict=True)


def test_the_validator_rejects_a_misspelt_field():
    broken = copy.deepcopy(manifests()["Deployment"])
    container = broken["spec"]["template"]["spec"]["containers"][0]
    container["readinessProbe"]["httpGet"]["paht"] = container["readinessProbe"]["httpGet"].pop("path")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


# kubernetes-validate has no schema for KServe's CRDs, so this one is written here from the
# fields KServe documents for ServingRuntime (serving.kserve.io/v1alpha1, ServingRuntimeSpec and
# its inlined ServingRuntimePodSpec); the embedded containers and volumes are checked against
# Kubernetes' own core/v1 schemas.
K8S_DEFS = "https://kubernetes.io/api/_definitions.json#/$defs/"
SERVING_RUNTIME_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "serving.kserve.io/v1alpha1"},
        "kind": {"enum": ["ServingRuntime", "ClusterServingRuntime"]},
        "metadata": {"$ref": K8S_DEFS + "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"},
        "spec": {
            "type": "object",
            "required": ["containers"],
            "additionalProperties": False,
            "properties": {
                "supportedModelFormats": {"type": "array", "items": {
                    "type": "object", "required": ["name"], "additionalProperties": False,
                    "properties": {"name": {"type": "string"}, "version": {"type": "string"},
                                   "autoSelect": {"type": "boolean"},
                                   "priority": {"type": "integer", "minimum": 1}}}},
                "multiModel": {"type": "boolean"},
                "disabled": {"type": "boolean"},
                "protocolVersions": {"type": "array", "items": {
                    "enum": ["v1", "v2", "grpc-v1", "grpc-v2"]}},
                "grpcEndpoint": {"type": "string"},
                "grpcDataEndpoint": {"type": "string"},
                "httpDataEndpoint": {"type": "string"},
                "replicas": {"type": "integer", "minimum": 0},
                "storageHelper": {"type": "object", "additionalProperties": False,
                                  "properties": {"disabled": {"type": "boolean"}}},
                "containers": {"type": "array", "minItems": 1,
                               "items": {"$ref": K8S_DEFS + "io.k8s.api.core.v1.Container"}},
                "volumes": {"type": "array",
                            "items": {"$ref": K8S_DEFS + "io.k8s.api.core.v1.Volume"}},
                "nodeSelector": {"type": "object", "additionalProperties": {"type": "string"}},
                "affinity": {"$ref": K8S_DEFS + "io.k8s.api.core.v1.Affinity"},
                "tolerations": {"type": "array",
                                "items": {"$ref": K8S_DEFS + "io.k8s.api.core.v1.Toleration"}},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
                "imagePullSecrets": {"type": "array", "items": {
                    "$ref": K8S_DEFS + "io.k8s.api.core.v1.LocalObjectReference"}},
            },
        },
    },
}


def serving_runtime_validator():
    path = f"kubernetes-json-schema/v{KUBERNETES_VERSION}-local-strict/_definitions.json"
    with open(os.path.join(os.path.dirname(kubernetes_validate.__file__), path)) as f:
        definitions = referencing.Resource.from_contents(json.load(f))
    registry = referencing.Registry().with_resource(definitions.id(), definitions)
    return jsonschema.Draft202012Validator(SERVING_RUNTIME_SCHEMA, registry=registry)


def test_serving_runtime_matches_kserves_fields():
    runtime = manifests()["ServingRuntime"]
    validator = serving_runtime_validator()
    validator.validate(runtime)
    broken = copy.deepcopy(runtime)
    broken["spec"]["containers"][0]["imagee"] = "x"
    assert not validator.is_valid(broken)
    spec = runtime["spec"]
    assert {"v2", "grpc-v2"} <= set(spec["protocolVersions"])
    container = spec["containers"][0]
    # KServe routes to the container of this name, and passes the models in /mnt/models.
    assert container["name"] == "kserve-container"
    opts, _ = parse_options(container["args"])
    assert opts.model_repository == ["/mnt/models"] and opts.http_port == 8080
    assert opts.allow_client_shm  # off by default, as in Triton: zero-copy clients are the point


def shmserve_container(deployment):
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def test_deployment_probes_drain_and_shared_memory():
    deployment = manifests()["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    container = shmserve_container(deployment)
    opts, _ = parse_options(container["args"])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": opts.http_port, "grpc": opts.grpc_port, "metrics": opts.metrics_port}
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["startupProbe"]["httpGet"]["path"] == "/v2/health/live"
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    # The kubelet's SIGKILL must come after the preStop pause and the server's whole drain.
    assert pod["terminationGracePeriodSeconds"] > pre_stop + opts.exit_timeout_secs
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    assert opts.allow_client_shm
    assert mounts[opts.model_repository[0]] in volumes


def test_service_and_autoscaler_point_at_the_deployment():
    kinds = manifests()
    deployment, service, hpa = kinds["Deployment"], kinds["Service"], kinds["HorizontalPodAutoscaler"]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    names = {p["name"] for p in shmserve_container(deployment)["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} == names
    assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    (metric,) = hpa["spec"]["metrics"]
    rules = yaml.safe_load(kinds["ConfigMap"]["data"]["config.yaml"])["rules"]
    assert metric["pods"]["metric"]["name"] in {r["name"]["as"] for r in rules}


def unit_file() -> dict:
    """{(section, key): [values]} of the unit file, continuation lines joined."""
    out = {}
    section = None
    with open(UNIT) as f:
        text = re.sub(r"\\\n", " ", f.read())
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, value = line.split("=", 1)
        out.setdefault((section, key.strip()), []).append(value.strip())
    return out


def test_systemd_unit_settings():
    unit = unit_file()
    service = {key: values[-1] for (section, key), values in unit.items() if section == "Service"}
    assert service["Type"] == "notify" and service["NotifyAccess"] == "main"
    assert service["KillSignal"] == "SIGTERM" and service["KillMode"] == "mixed"
    assert service["Restart"] == "on-failure"
    assert service["User"] not in ("", "root")
    assert int(service["WatchdogSec"]) > 0
    command = shlex.split(service["ExecStart"])
    assert command[0].endswith("/bin/shmserve")
    opts, _ = parse_options(command[1:])
    assert int(service["TimeoutStopSec"]) > opts.exit_timeout_secs
    assert opts.allow_client_shm
    assert unit[("Install", "WantedBy")] == ["multi-user.target"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
def test_systemd_analyze_verify(tmp_path):
    unit = tmp_path / "shmserve.service"
    shutil.copy(UNIT, unit)
    result = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)],
                            capture_output=True, text=True, timeout=60)
    # The virtual environment of ExecStart is not installed here: that complaint alone is
    # expected; an unknown key or a bad value is not.
    executable = shlex.split(unit_file()[("Service", "ExecStart")][-1])[0]
    others = [line for line in (result.stdout + result.stderr).splitlines()
              if line.strip() and f"Command {executable} is not executable" not in line]
    assert not others, "\n".join(others)


def test_dashboard_shape():
    with open(os.path.join(DEPLOY, "grafana", "shmserve-dashboard.json")) as f:
        dashboard = json.load(f)
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    graphs = [p for p in panels if p["type"] != "row"]
    assert graphs and all(t["expr"].strip() for p in graphs for t in p["targets"])
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {p["datasource"]["uid"] for p in graphs} == {"${datasource}"} and "datasource" in variables
    used = set(re.findall(r"\$(\w+)", " ".join(t["expr"] for p in graphs for t in p["targets"])))
    assert used - {"__rate_interval"} <= variables
