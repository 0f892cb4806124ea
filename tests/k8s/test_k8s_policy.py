"""The policy the rendered objects keep (docs/kubernetes.md): every container runs as a
non-root user without privilege escalation, on a read-only root, with resources requested
and limited; the server is probed on its health endpoint; images are pinned; Ray's ports
stay inside the cluster and only the API port is admitted from outside; the service
account may only read."""

from __future__ import annotations

import re

import pytest
from k8s_manifests import API_PORT, KUSTOMIZATIONS, REPO, Pod, of_kind, one, pods, render, server_container

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

RAY_PORTS = {6379, 6380, 8265, 10001, 8080, 52365}
READ_ONLY_VERBS = {"get", "list", "watch"}


def container_context(pod: Pod, container: dict) -> dict:
    """A container's effective security settings: its own over its pod's."""
    return {**pod.spec.get("securityContext", {}), **container.get("securityContext", {})}


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_every_container_is_restricted_non_root(kustomization: str) -> None:
    for pod in pods(render(kustomization)):
        assert pod.spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", pod.where
        assert pod.spec.get("automountServiceAccountToken") is False, pod.where
        assert not pod.spec.get("hostNetwork") and not pod.spec.get("hostPID"), pod.where
        for c in pod.containers():
            ctx, where = container_context(pod, c), f"{pod.where} {c['name']}"
            assert ctx.get("runAsNonRoot") is True and ctx.get("runAsUser", 1) != 0, where
            assert ctx.get("allowPrivilegeEscalation") is False and not ctx.get("privileged"), where
            assert ctx.get("capabilities", {}).get("drop") == ["ALL"], where
            assert not ctx.get("capabilities", {}).get("add"), where
            assert ctx.get("readOnlyRootFilesystem") is True, where
            assert all("hostPort" not in p for p in c.get("ports", [])), where


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_every_container_requests_and_limits_cpu_and_memory(kustomization: str) -> None:
    for pod in pods(render(kustomization)):
        for c in pod.containers():
            resources = c.get("resources", {})
            for bound in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(resources.get(bound, {})), f"{pod.where} {c['name']} {bound}"


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_the_server_is_probed_on_its_health_endpoint(kustomization: str) -> None:
    routes = re.findall(r'@app\.get\("([^"]+)"', (REPO / "server" / "app.py").read_text())
    server = server_container(render(kustomization))
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        check = server[probe]["httpGet"]
        assert check["path"] in routes and check["port"] in ("api", API_PORT), (probe, check)


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_every_image_is_pinned(kustomization: str) -> None:
    for pod in pods(render(kustomization)):
        for c in pod.containers():
            image = c["image"]
            tag = image.rsplit("/", 1)[-1].partition(":")[2].partition("@")[0]
            assert "@sha256:" in image or (tag and tag != "latest"), f"{pod.where} {c['name']}: {image}"
            assert c.get("imagePullPolicy", "IfNotPresent") != "Always", f"{pod.where} {c['name']}"


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_no_ray_port_is_reachable_from_outside_the_cluster(kustomization: str) -> None:
    objects = render(kustomization)
    for svc in of_kind(objects, "Service"):
        ports = {p["port"] for p in svc["spec"]["ports"]}
        if svc["spec"].get("type", "ClusterIP") != "ClusterIP":
            assert ports <= {API_PORT}, f"Service/{svc['metadata']['name']} exposes {ports} outside"
    assert API_PORT not in RAY_PORTS
    head = one(objects, "RayCluster", "isthmus")["spec"]["headGroupSpec"]
    assert head.get("serviceType", "ClusterIP") == "ClusterIP", "KubeRay's head Service carries Ray's ports"
    assert not head.get("enableIngress"), "an Ingress to the head would carry Ray's dashboard port"


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_network_policy_admits_the_api_port_from_anywhere_and_the_rest_only_between_pods(
        kustomization: str) -> None:
    policies = of_kind(render(kustomization), "NetworkPolicy")
    assert any(p["spec"]["podSelector"] == {} and not p["spec"].get("ingress")
               and "Ingress" in p["spec"]["policyTypes"] for p in policies), "no default deny"
    for policy in policies:
        for rule in policy["spec"].get("ingress", []):
            peers = rule.get("from", [])
            pods_only = peers and all(set(peer) == {"podSelector"} for peer in peers)
            if not pods_only:  # from anywhere, another namespace or an address range
                ports = [p.get("port") for p in rule.get("ports", [{}])]
                assert ports == [API_PORT], f"NetworkPolicy/{policy['metadata']['name']} admits {ports}"


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_the_service_account_may_only_read_and_no_secret(kustomization: str) -> None:
    objects = render(kustomization)
    assert not of_kind(objects, "ClusterRole") and not of_kind(objects, "ClusterRoleBinding")
    for role in of_kind(objects, "Role"):
        for rule in role["rules"]:
            assert set(rule["verbs"]) <= READ_ONLY_VERBS, rule
            assert not {"secrets", "*"} & set(rule["resources"]), rule
    (account,) = of_kind(objects, "ServiceAccount")
    assert {p.spec.get("serviceAccountName") for p in pods(objects)} == {account["metadata"]["name"]}
