"""`k8s/` renders, and what it renders keeps the contract docs/kubernetes.md states: islands
are KubeRay worker groups labelled through the group's `labels`, Ray requires its token,
the server reads its settings, tokens and state where the manifests put them."""

from __future__ import annotations

import re

import pytest
from k8s_manifests import (
    API_PORT,
    DEVICES_LABEL,
    ISLAND_LABEL,
    KUSTOMIZATIONS,
    NAMESPACE,
    OVERLAYS,
    Manifest,
    of_kind,
    one,
    render,
    server_container,
)

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

KINDS = {"Namespace", "ServiceAccount", "Role", "RoleBinding", "ConfigMap", "PersistentVolumeClaim",
         "RayCluster", "Service", "NetworkPolicy", "PodDisruptionBudget"}
# island -> (hosts, what each host holds): CPU hosts by their devices label, GPU hosts by the
# GPUs their Ray container is given.
SHAPES = {
    "overlays/cpu-demo": {"a": (2, {DEVICES_LABEL: "4"}), "b": (2, {DEVICES_LABEL: "4"})},
    "overlays/gpu": {"a": (1, {"nvidia.com/gpu": "1"}), "b": (1, {"nvidia.com/gpu": "1"})},
}
QUALIFIED_NAME = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                            r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


def raycluster(kustomization: str) -> Manifest:
    return one(render(kustomization), "RayCluster", "isthmus")


def env(container: Manifest) -> dict[str, Manifest]:
    return {e["name"]: e for e in container.get("env", [])}


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_each_kustomization_renders_every_part_into_the_namespace(kustomization: str) -> None:
    objects = render(kustomization)
    assert {o["kind"] for o in objects} == KINDS
    for o in objects:
        if o["kind"] != "Namespace":
            assert o["metadata"].get("namespace") == NAMESPACE, f"{o['kind']}/{o['metadata']['name']}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_islands_are_worker_groups_of_the_overlays_shape(overlay: str) -> None:
    found = {}
    for group in raycluster(overlay)["spec"]["workerGroupSpecs"]:
        assert group["replicas"] == group["minReplicas"] == group["maxReplicas"], group["groupName"]
        limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
        held = {**group["labels"], **limits}
        holds = {k: v for k, v in held.items() if k in (DEVICES_LABEL, "nvidia.com/gpu")}
        found[group["labels"][ISLAND_LABEL]] = (group["replicas"], holds)
    assert found == SHAPES[overlay]


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_ray_node_labels_come_from_the_groups_labels_field(kustomization: str) -> None:
    spec = raycluster(kustomization)["spec"]
    head = spec["headGroupSpec"]
    assert "labels" not in head["rayStartParams"]  # KubeRay refuses labels given there
    assert ISLAND_LABEL not in head.get("labels", {}), "the head hosts no executor"
    islands = [g["labels"][ISLAND_LABEL] for g in spec["workerGroupSpecs"]]
    assert len(islands) == len(set(islands)), f"two worker groups name one island: {islands}"
    for group in spec["workerGroupSpecs"]:
        assert "labels" not in group["rayStartParams"], group["groupName"]
        assert group["groupName"] == f"island-{group['labels'][ISLAND_LABEL]}"
        for key, value in group["labels"].items():
            assert QUALIFIED_NAME.match(key) and LABEL_VALUE.match(value), (group["groupName"], key, value)
        assert re.fullmatch(r"[1-9][0-9]*", group["labels"].get(DEVICES_LABEL, "1")), group["groupName"]


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_ray_requires_its_token_and_the_server_reads_tokens_from_secrets(kustomization: str) -> None:
    objects = render(kustomization)
    auth = raycluster(kustomization)["spec"]["authOptions"]
    assert auth["mode"] == "token" and auth["secretName"]
    variables = env(server_container(objects))
    ray_token = variables["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert (ray_token["name"], ray_token["key"]) == (auth["secretName"], "auth_token")
    assert "secretKeyRef" in variables["ISTHMUS_TOKEN"]["valueFrom"]
    assert not of_kind(objects, "Secret"), "tokens are made at deployment, never kept in k8s/"
    for name, var in variables.items():
        assert "TOKEN" not in name or "value" not in var, f"{name} is written out, not read from a Secret"


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_the_server_settings_match_its_port_its_state_volume_and_the_ray_head(kustomization: str) -> None:
    objects = render(kustomization)
    server = server_container(objects)
    (source,) = server["envFrom"]
    settings = one(objects, "ConfigMap", source["configMapRef"]["name"])["data"]
    assert int(settings["ISTHMUS_PORT"]) == API_PORT
    assert [p["containerPort"] for p in server["ports"] if p["name"] == "api"] == [API_PORT]
    assert settings["ISTHMUS_RAY_ADDRESS"] == "127.0.0.1:6379"  # the head's GCS, in the same pod
    # The state dir lies strictly below the claim's mount: the server makes it 0700 itself
    # (a volume's root belongs to the pod's fsGroup, which the server would refuse).
    mounts = {m["name"]: m["mountPath"] for m in server["volumeMounts"]}
    head = raycluster(kustomization)["spec"]["headGroupSpec"]["template"]["spec"]
    (claim,) = [v for v in head["volumes"] if "persistentVolumeClaim" in v]
    one(objects, "PersistentVolumeClaim", claim["persistentVolumeClaim"]["claimName"])
    assert settings["ISTHMUS_STATE_DIR"].startswith(mounts[claim["name"]].rstrip("/") + "/")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_hosts_may_be_drained_one_at_a_time_and_the_head_not_at_all(overlay: str) -> None:
    objects = render(overlay)
    hosts = sum(g["replicas"] for g in raycluster(overlay)["spec"]["workerGroupSpecs"])
    assert one(objects, "PodDisruptionBudget", "isthmus-hosts")["spec"]["minAvailable"] == hosts - 1
    assert one(objects, "PodDisruptionBudget", "isthmus-head")["spec"]["minAvailable"] == 1


def _bytes(quantity: str) -> int:
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return int(quantity[: -len(suffix)]) * factor
    return int(quantity)


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_each_ray_node_s_object_store_fits_its_shared_memory(kustomization: str) -> None:
    """Ray's default store (30% of the container's memory) would outgrow /dev/shm and fall back
    to disk; every node sets one that fits its shm volume."""
    [cluster] = of_kind(render(kustomization), "RayCluster")
    groups = [cluster["spec"]["headGroupSpec"], *cluster["spec"].get("workerGroupSpecs", [])]
    for group in groups:
        spec = group["template"]["spec"]
        shm = next(v for v in spec["volumes"] if v["name"] == "shm")["emptyDir"]
        store = int(group["rayStartParams"]["object-store-memory"])
        assert shm.get("medium") == "Memory" and store <= _bytes(shm["sizeLimit"]), (kustomization, group)
