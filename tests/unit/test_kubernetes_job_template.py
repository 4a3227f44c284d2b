"""deploy/kubernetes/measure-job-template.json: the base job template of a Prefect Kubernetes
work pool for measure runs (issue 37, item 5). It passes the checks Prefect's server makes
when the pool is created; the Job is rendered as prefect-kubernetes' worker renders it for a
flow run (its job configuration class, with a deployment's job variables); and that Job is
held to the Kubernetes API schema by the official client's models: a field the API would not
know (and would drop with a warning) or a value of the wrong type fails here."""

from __future__ import annotations

import copy
import json
import uuid
from pathlib import Path

import jsonschema
import pytest
from kubernetes.client import ApiClient
from prefect.client.schemas.objects import FlowRun
from prefect.server.schemas.actions import WorkPoolCreate
from prefect.utilities.templating import apply_values
from prefect_kubernetes.worker import KubernetesWorkerJobConfiguration

TEMPLATE = (
    Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "measure-job-template.json"
)


def schema_problems(manifest: dict, kind: str = "V1Job") -> list[str]:
    """What the Kubernetes client's models do not take from ``manifest``: every path the
    model drops (an unknown or misplaced field). A value of the wrong type raises."""
    api = ApiClient()
    back = api.sanitize_for_serialization(
        api.deserialize(json.dumps(manifest), kind, "application/json")
    )
    problems: list[str] = []

    def walk(ours, theirs, path: str) -> None:
        if isinstance(ours, dict):
            for key, value in ours.items():
                if not isinstance(theirs, dict) or key not in theirs:
                    problems.append(f"{path}.{key}")
                else:
                    walk(value, theirs[key], f"{path}.{key}")
        elif isinstance(ours, list):
            for i, (a, b) in enumerate(zip(ours, theirs or [], strict=False)):
                walk(a, b, f"{path}[{i}]")

    walk(manifest, back, kind)
    return problems


def _template() -> dict:
    return json.loads(TEMPLATE.read_text())


def _render(job_variables: dict | None = None) -> dict:
    """The Job the Kubernetes worker submits for a flow run: the variables' defaults and a
    deployment's job variables applied to the template (Prefect's templating), then the
    worker's own preparation (command, Prefect's environment, labels, name)."""
    template = _template()
    values = KubernetesWorkerJobConfiguration._get_base_config_defaults(
        template["variables"]["properties"]
    )
    values |= job_variables or {}
    config = KubernetesWorkerJobConfiguration(
        **apply_values(copy.deepcopy(template["job_configuration"]), values)
    )
    run = FlowRun(id=uuid.uuid4(), name="measure-fp8", flow_id=uuid.uuid4())
    config.prepare_for_flow_run(run)
    return config.job_manifest


def test_prefect_would_create_the_pool_with_it():
    template = _template()
    pool = WorkPoolCreate(name="llm-release-k8s", type="kubernetes", base_job_template=template)
    assert pool.base_job_template["job_configuration"]["job_manifest"]["kind"] == "Job"
    jsonschema.Draft7Validator.check_schema(template["variables"])
    defaults = {
        k: v["default"] for k, v in template["variables"]["properties"].items() if "default" in v
    }
    jsonschema.validate(defaults, template["variables"])


def test_the_rendered_job_is_a_valid_kubernetes_job():
    job = _render()
    assert schema_problems(job) == []
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert container["resources"]["requests"]["nvidia.com/gpu"] == "1"
    shm = next(v for v in pod["volumes"] if v["name"] == "shm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
    assert {"name": "shm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    env = {e["name"]: e for e in container["env"]}
    hub = "http://llm-release-hub.llm-release.svc:8090"
    assert env["LLM_RELEASE_HF_TOKEN_ENDPOINTS"]["value"] == hub  # the token goes there only
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "llm-release-hub-token"
    assert "value" not in env["LLM_RELEASE_DATABASE_URL"]  # from a Secret, never inline
    assert job["spec"]["backoffLimit"] == 0  # a lost attempt is sent again by the release
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert container["args"] == ["prefect", "flow-run", "execute"]
    assert "PREFECT__FLOW_RUN_ID" in env  # the worker's variables come before the template's


def test_a_deployment_asks_for_the_gpus_of_its_plan():
    job = _render({"gpus": "4", "shm_size": "32Gi", "node_selector": {"gpu": "h200"}})
    assert schema_problems(job) == []
    pod = job["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert pod["nodeSelector"] == {"gpu": "h200"}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"gpus": "0"}, _template()["variables"])


def test_the_check_finds_what_the_api_would_drop_or_refuse():
    """Prefect's own default Kubernetes template puts 'completions' and 'parallelism' (Job
    fields) in the pod's spec, where the API ignores them: the check names them."""
    job = _render()
    misplaced = copy.deepcopy(job)
    misplaced["spec"]["template"]["spec"]["completions"] = 1
    misplaced["spec"]["template"]["spec"]["containers"][0]["shmSize"] = "16Gi"
    assert set(schema_problems(misplaced)) == {
        "V1Job.spec.template.spec.completions",
        "V1Job.spec.template.spec.containers[0].shmSize",
    }
    mistyped = copy.deepcopy(job)
    mistyped["spec"]["backoffLimit"] = "none"
    with pytest.raises(ValueError):
        schema_problems(mistyped)
