"""Every rendered object validates: Kubernetes' own kinds against the Kubernetes schemas
(kubernetes-validate, strict: an unknown field is an error), at Kubernetes 1.25 and the newest
version it knows; each RayCluster against KubeRay's CRD schema, kept beside the
project in shared/schemas/kuberay, with unknown fields refused as a strict server does, and
the pod templates inside it against Kubernetes' PodTemplateSpec."""

from __future__ import annotations

import copy
import functools
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from k8s_manifests import KUSTOMIZATIONS, REPO, Manifest, of_kind, pods, render

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]

CRD = REPO.parent / "shared" / "schemas" / "kuberay" / "ray.io_rayclusters.yaml"
# The oldest Kubernetes whose schemas kubernetes-validate ships, and its newest.
VERSIONS = ("1.25.0", kubernetes_validate.latest_version())


def closed(schema: Any) -> Any:
    """`schema` with unknown fields refused wherever it lists an object's fields and does not
    say that others are kept: the API server prunes such fields in silence, so a misspelt
    field would otherwise pass here and be lost there."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: closed(v) for k, v in schema.items()}
    if ("properties" in schema and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


@functools.cache
def raycluster_validator() -> jsonschema.Draft7Validator:
    if not CRD.exists():
        pytest.skip(f"KubeRay's CRD schema is not beside the project ({CRD})")
    crd = yaml.safe_load(CRD.read_text())
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return jsonschema.Draft7Validator(closed(v1["schema"]["openAPIV3Schema"]))


def crd_errors(obj: Manifest) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
            for e in raycluster_validator().iter_errors(obj)]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_kubernetes_objects_validate_against_the_kubernetes_schemas(kustomization: str, version: str) -> None:
    for obj in render(kustomization):
        if obj["kind"] != "RayCluster":
            kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_pod_templates_in_the_raycluster_validate_as_pod_templates(kustomization: str, version: str) -> None:
    clusters = tuple(of_kind(render(kustomization), "RayCluster"))
    for pod in pods(clusters):
        template = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"},
                    "template": {"metadata": pod.metadata, "spec": pod.spec}}
        kubernetes_validate.validate(template, version, strict=True)


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_rayclusters_validate_against_kuberays_crd(kustomization: str) -> None:
    (cluster,) = of_kind(render(kustomization), "RayCluster")
    assert cluster["apiVersion"] == "ray.io/v1"
    assert crd_errors(cluster) == []


def test_the_crd_check_refuses_a_misspelt_field_and_a_wrong_type() -> None:
    (cluster,) = of_kind(render("overlays/cpu-demo"), "RayCluster")
    bad = copy.deepcopy(cluster)
    group = bad["spec"]["workerGroupSpecs"][0]
    group["lables"] = group.pop("labels")
    group["rayStartParams"]["node-manager-port"] = 6380  # rayStartParams are strings
    errors = crd_errors(bad)
    assert len(errors) == 2 and any("lables" in e for e in errors), errors
