"""docker/kubernetes: the autoscaling recipe, checked without a cluster (kubeconform-style).

The Kubernetes resources are validated by the official Python client's models (strict
pydantic models generated from the API's OpenAPI document: unknown fields, wrong types
and missing required fields are refused), the ScaledObjects by KEDA's own CRD schema
(``schemas/keda.sh_scaledobjects.v2.20.2.yaml``, from kedacore/keda at v2.20.2, Apache
2.0) made strict as kubeconform does, and every PromQL query by promtool, both checked
and run on sample series (``promtool test rules``).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from kubernetes import client as k8s
from pydantic import BaseModel

from conventions.ops import exporter as metrics
from tests.unit.test_prometheus_rules import promtool

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "docker" / "kubernetes"
COMPOSE = ROOT / "docker" / "compose.yaml"
KEDA_CRD = Path(__file__).parent / "schemas" / "keda.sh_scaledobjects.v2.20.2.yaml"
#: the Prometheus scaler's parameters (kedacore/keda v2.20.2, pkg/scalers/prometheus_scaler.go)
KEDA_PROMETHEUS_REQUIRED = {"serverAddress", "query", "threshold"}
KEDA_PROMETHEUS_OPTIONAL = {
    "queryParameters",
    "activationThreshold",
    "namespace",
    "customHeaders",
    "ignoreNullValues",
    "unsafeSsl",
    "awsRegion",
    "timeout",
    "identityOwner",
}
#: (apiVersion, kind) -> the client's model of it
MODELS: dict[tuple[str, str], type[BaseModel]] = {
    ("apps/v1", "Deployment"): k8s.V1Deployment,
    ("v1", "Service"): k8s.V1Service,
    ("v1", "ConfigMap"): k8s.V1ConfigMap,
    ("autoscaling/v2", "HorizontalPodAutoscaler"): k8s.V2HorizontalPodAutoscaler,
}
#: Celery's soft shutdown window after the layer's grace (``worker_soft_shutdown_timeout``)
SOFT_SHUTDOWN_S = 10


def documents(*parts: str) -> list[dict[str, Any]]:
    folder = KUBE.joinpath(*parts)
    found = [
        doc
        for path in sorted(folder.rglob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc is not None
    ]
    assert found, folder
    return found


def of_kind(kind: str, *parts: str) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for doc in documents(*parts) if doc["kind"] == kind}


def strict(schema: Any) -> Any:
    """The schema with ``additionalProperties: false`` wherever it lists properties and
    allows no unknown field (kubeconform's ``-strict``): a misspelt key fails."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: strict(value) for key, value in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def keda_schema() -> dict[str, Any]:
    crd = yaml.safe_load(KEDA_CRD.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    schema: dict[str, Any] = strict(version["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"type": "object"}
    return schema


def workers() -> dict[str, dict[str, Any]]:
    """The worker Deployments of base/ (not the exporter's)."""
    return {n: d for n, d in of_kind("Deployment", "base").items() if n.startswith("worker-")}


def worker_queue(deployment: dict[str, Any]) -> str:
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return str(args[args.index("-Q") + 1])


def age_and_depth_queries() -> list[tuple[str, str, str]]:
    """(scaled object, trigger name, query) of every KEDA trigger."""
    return [
        (name, trigger["name"], trigger["metadata"]["query"])
        for name, scaled in of_kind("ScaledObject", "keda").items()
        for trigger in scaled["spec"]["triggers"]
    ]


def adapter_rules() -> list[dict[str, Any]]:
    (config,) = of_kind("ConfigMap", "hpa").values()
    rules: list[dict[str, Any]] = yaml.safe_load(config["data"]["config.yaml"])["externalRules"]
    return rules


def rendered(rule: dict[str, Any], queue: str) -> str:
    """The adapter's query as it sends it for an HPA selecting ``queue``."""
    series = re.match(r"[a-z_:]+", rule["seriesQuery"].strip("'"))
    assert series is not None
    return (
        rule["metricsQuery"]
        .replace("<<.Series>>", series.group(0))
        .replace("<<.LabelMatchers>>", f'queue="{queue}"')
    )


def test_every_kubernetes_resource_of_the_recipe_matches_the_api_schema() -> None:
    kinds = set()
    for doc in documents():
        if doc["kind"] == "ScaledObject":
            continue
        model = MODELS.get((doc["apiVersion"], doc["kind"]))
        assert model is not None, f"no schema for {doc['apiVersion']} {doc['kind']}"
        model.model_validate(doc)
        kinds.add(doc["kind"])
    assert kinds == {kind for _, kind in MODELS}


def test_the_api_schema_check_refuses_a_misspelt_field() -> None:
    hpa = of_kind("HorizontalPodAutoscaler", "hpa")["worker-email"]
    bad = {**hpa, "spec": {**hpa["spec"], "maxReplica": 3}}
    with pytest.raises(ValueError, match="maxReplica"):
        k8s.V2HorizontalPodAutoscaler.model_validate(bad)


def test_every_scaled_object_matches_keda_s_crd_schema() -> None:
    validator = jsonschema.Draft7Validator(keda_schema())
    scaled = of_kind("ScaledObject", "keda")
    assert scaled
    for doc in scaled.values():
        assert doc["apiVersion"] == "keda.sh/v1alpha1"
        errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(doc)]
        assert not errors, errors
    misspelt = {**doc, "spec": {**doc["spec"], "minReplicas": 1}}
    assert not validator.is_valid(misspelt)


def test_the_prometheus_triggers_give_only_the_scaler_s_parameters() -> None:
    for scaled in of_kind("ScaledObject", "keda").values():
        for trigger in scaled["spec"]["triggers"]:
            assert trigger["type"] == "prometheus"
            assert trigger["metricType"] in {"Value", "AverageValue"}
            given = set(trigger["metadata"])
            assert given >= KEDA_PROMETHEUS_REQUIRED
            assert given <= KEDA_PROMETHEUS_REQUIRED | KEDA_PROMETHEUS_OPTIONAL
            assert float(trigger["metadata"]["threshold"]) > 0


def test_each_autoscaler_scales_a_worker_deployment_on_the_queue_it_consumes() -> None:
    for name, scaled in of_kind("ScaledObject", "keda").items():
        ref = scaled["spec"]["scaleTargetRef"]
        assert (ref["apiVersion"], ref["kind"], ref["name"]) == ("apps/v1", "Deployment", name)
        queue = worker_queue(workers()[name])
        for trigger in scaled["spec"]["triggers"]:
            assert set(re.findall(r'queue="([^"]*)"', trigger["metadata"]["query"])) == {queue}
    for name, hpa in of_kind("HorizontalPodAutoscaler", "hpa").items():
        ref = hpa["spec"]["scaleTargetRef"]
        assert (ref["apiVersion"], ref["kind"], ref["name"]) == ("apps/v1", "Deployment", name)
        queue = worker_queue(workers()[name])
        for metric in hpa["spec"]["metrics"]:
            assert metric["external"]["metric"]["selector"] == {"matchLabels": {"queue": queue}}


def test_the_queries_read_only_served_metrics_and_the_routed_queues() -> None:
    import celeryconfig

    served = metrics.exported_names()
    queues = set(celeryconfig.WORKLOADS.values())
    used = {m for _, _, query in age_and_depth_queries() for m in re.findall(r"\w+(?={)", query)}
    used |= {re.findall(r"\w+", rule["seriesQuery"])[0] for rule in adapter_rules()}
    used |= {
        metric["external"]["metric"]["name"]
        for hpa in of_kind("HorizontalPodAutoscaler", "hpa").values()
        for metric in hpa["spec"]["metrics"]
    }
    assert used == {
        "celery_conventions_queue_oldest_age_seconds",
        "celery_conventions_queue_depth",
    }
    assert used <= served
    assert {worker_queue(d) for d in workers().values()} == queues


def test_keda_and_the_hpa_apply_the_same_policy() -> None:
    """The two recipes are alternatives: a threshold changed in one is changed in both."""
    for name, scaled in of_kind("ScaledObject", "keda").items():
        hpa = of_kind("HorizontalPodAutoscaler", "hpa")[name]["spec"]
        spec = scaled["spec"]
        assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (
            hpa["minReplicas"],
            hpa["maxReplicas"],
        )
        assert spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] == hpa["behavior"]
        keda = {
            (t["metadata"]["query"].split("{")[0].split("(")[-1], t["metricType"]): float(
                t["metadata"]["threshold"]
            )
            for t in spec["triggers"]
        }
        external = {
            (m["external"]["metric"]["name"], m["external"]["target"]["type"]): float(
                m["external"]["target"].get("value") or m["external"]["target"]["averageValue"]
            )
            for m in hpa["metrics"]
        }
        assert keda == external


def test_the_age_target_leaves_time_to_add_workers_before_the_slo_alert() -> None:
    """Scale-up must start well before QueueOldestJobOverSLO pages: at half the SLO at most."""
    import celeryconfig

    slos = celeryconfig.conventions_queue_slo_seconds
    for name, scaled in of_kind("ScaledObject", "keda").items():
        (age,) = [t for t in scaled["spec"]["triggers"] if "oldest_age" in t["metadata"]["query"]]
        assert age["metricType"] == "Value"
        assert float(age["metadata"]["threshold"]) <= slos[worker_queue(workers()[name])] / 2


def test_never_fewer_than_one_worker_per_queue() -> None:
    """Only a live worker moves its queue's due delayed jobs and revives a dead one's jobs."""
    for scaled in of_kind("ScaledObject", "keda").values():
        assert scaled["spec"]["minReplicaCount"] >= 1
    for hpa in of_kind("HorizontalPodAutoscaler", "hpa").values():
        assert hpa["spec"]["minReplicas"] >= 1


def test_the_worker_deployments_run_the_compose_workers_commands_and_grace() -> None:
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    for name, deployment in workers().items():
        pod = deployment["spec"]["template"]["spec"]
        container = pod["containers"][0]
        assert container["args"] == shlex.split(services[name]["command"])
        assert "replicas" not in deployment["spec"]
        env = {item["name"]: item["value"] for item in container["env"]}
        grace = int(env["CONVENTIONS_SHUTDOWN_GRACE"])
        assert grace == int(services[name]["environment"]["CONVENTIONS_SHUTDOWN_GRACE"])
        assert pod["terminationGracePeriodSeconds"] >= grace + SOFT_SHUTDOWN_S


def test_every_autoscaling_query_is_valid_promql(tmp_path: Path) -> None:
    queries = [query for _, _, query in age_and_depth_queries()]
    queries += [rendered(rule, "email") for rule in adapter_rules()]
    recorded = [{"record": f"autoscale:query_{n}", "expr": q} for n, q in enumerate(queries)]
    path = tmp_path / "autoscale-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "autoscale", "rules": recorded}]}))
    assert "SUCCESS" in promtool("check", "rules", str(path))


def test_the_queries_give_one_value_per_queue_however_many_exporters_serve_it(
    tmp_path: Path,
) -> None:
    """Two exporters (they agree) and a stale one: the autoscaler sees the largest age of
    its own queue, never a sum nor the other queue's."""
    rules = [
        {"record": f"autoscale:{scaled.replace('-', '_')}:{trigger.replace('-', '_')}", "expr": q}
        for scaled, trigger, q in age_and_depth_queries()
    ]
    rules += [
        {"record": f"autoscale:adapter_{n}", "expr": rendered(rule, "email")}
        for n, rule in enumerate(adapter_rules())
    ]
    (tmp_path / "rules.yml").write_text(
        yaml.safe_dump({"groups": [{"name": "autoscale", "rules": rules}]})
    )

    def series(metric: str, queue: str, instance: str, values: str) -> dict[str, str]:
        labels = f'queue="{queue}",instance="{instance}",job="celery-conventions"'
        return {"series": f"celery_conventions_{metric}{{{labels}}}", "values": values}

    cases = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    series("queue_oldest_age_seconds", "email", "a", "45x2"),
                    series("queue_oldest_age_seconds", "email", "b", "40x2"),
                    series("queue_oldest_age_seconds", "heavy", "a", "900x2"),
                    series("queue_depth", "email", "a", "250x2"),
                    series("queue_depth", "email", "b", "250x2"),
                    series("queue_depth", "heavy", "a", "3x2"),
                ],
                "promql_expr_test": [
                    {"expr": "autoscale:worker_email:email_oldest_age", "eval_time": "1m",
                     "exp_samples": [{"labels": "autoscale:worker_email:email_oldest_age",
                                      "value": 45}]},
                    {"expr": "autoscale:worker_email:email_depth", "eval_time": "1m",
                     "exp_samples": [{"labels": "autoscale:worker_email:email_depth",
                                      "value": 250}]},
                    {"expr": "autoscale:worker_heavy:heavy_oldest_age", "eval_time": "1m",
                     "exp_samples": [{"labels": "autoscale:worker_heavy:heavy_oldest_age",
                                      "value": 900}]},
                    {"expr": "autoscale:adapter_0", "eval_time": "1m",
                     "exp_samples": [{"labels": 'autoscale:adapter_0{queue="email"}',
                                      "value": 45}]},
                    {"expr": "autoscale:adapter_1", "eval_time": "1m",
                     "exp_samples": [{"labels": 'autoscale:adapter_1{queue="email"}',
                                      "value": 250}]},
                ],
            }
        ],
    }  # fmt: skip
    (tmp_path / "rules.test.yml").write_text(yaml.safe_dump(cases))
    assert "SUCCESS" in promtool("test", "rules", "rules.test.yml", cwd=tmp_path)
