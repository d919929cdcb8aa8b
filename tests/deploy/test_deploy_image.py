"""docker/Dockerfile: lint, start command = the local launcher, pins, no root, no secrets."""
import ast
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from testing import REPO
from testing.dockerfile import DOCKERFILE, image_env, instructions


def only(keyword):
    found = [args for kw, args in instructions() if kw == keyword]
    assert len(found) == 1, f"expected one {keyword}, found {found}"
    return found[0]


def hadolint(path):
    binary = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    return subprocess.run([binary, "--no-color", str(path)], capture_output=True, text=True)


def test_hadolint_finds_nothing(tmp_path):
    result = hadolint(DOCKERFILE)
    assert result.returncode == 0, result.stdout + result.stderr
    sloppy = tmp_path / "Dockerfile"
    sloppy.write_text("FROM ubuntu\nRUN pip install torch\n")
    assert "DL3013" in hadolint(sloppy).stdout  # the linter does look (unpinned pip install)


def test_base_image_is_the_tested_triton_release():
    assert only("FROM") == "nvcr.io/nvidia/tritonserver:24.10-py3"  # Triton 2.51 = nvidia-pytriton 0.7.0


def test_start_command_is_the_local_launcher():
    command = json.loads(only("CMD"))
    assert command[:4] == ["/opt/rose/scripts/serve.sh", "--host", "0.0.0.0", "--"]
    assert all(arg.startswith("--") for arg in command[4:])  # tritonserver flags only
    assert "ENTRYPOINT" not in dict(instructions())  # the base image's entrypoint execs CMD
    assert only("WORKDIR") == "/opt/rose"
    # the launcher, the watchdog it starts (serve.sh runs without it, with a warning), the
    # repository assembly behind --rerank-model-dir and models served by name (rose_triton/) with its model sets
    copies = [args for kw, args in instructions() if kw == "COPY"]
    assert "scripts/serve.sh scripts/watchdog.py scripts/" in copies
    assert {"model_sets/ model_sets/", "rose_triton/ rose_triton/"} <= set(copies)
    assert image_env()["ROSE_SKIP_SETUP"] == "1"
    copied = [args for kw, args in instructions() if kw == "COPY"]
    assert {"gateway/ gateway/", "rose_client/ rose_client/", "rose_wire/ rose_wire/"} <= set(copied)  # the gateway role
    assert "8080" in only("EXPOSE").split()


def test_everything_copied_exists_and_is_pinned():
    for kw, args in instructions():
        if kw == "COPY":
            sources = args.split()[:-1]
            for source in sources:
                if not source.startswith("${"):
                    assert (REPO / source).exists(), source
    assert (REPO / "docker" / "models").is_dir()  # default MODEL_CONTEXT_DIR


def test_image_packages_match_the_tested_lock():
    lock = dict(line.split("==") for line in (REPO / "requirements.lock").read_text().split() if "==" in line)
    for name in ("requirements-image.txt", "requirements-flashinfer.txt"):
        for line in (REPO / "docker" / name).read_text().splitlines():
            if line and not line.startswith("#"):
                package, version = line.split("==")
                assert re.fullmatch(r"[\w.]+", version), line
                if package in lock:
                    assert lock[package] == version, f"{name}: {line}, requirements.lock has {lock[package]}"


def test_runs_as_non_root_with_a_healthcheck_and_no_secrets():
    user = [args for kw, args in instructions() if kw == "USER"][-1]
    assert user.isdigit() and int(user) != 0
    healthcheck = only("HEALTHCHECK")
    assert "/v2/health/ready" in healthcheck and healthcheck.split("CMD", 1)[1].strip().startswith("[")
    names = [name for kw, args in instructions() if kw in ("ENV", "ARG") for name in re.findall(r"(\w+)=", args + "=")]
    assert not [n for n in names if re.search(r"TOKEN|SECRET|PASSWORD|KEY|CREDENTIAL", n, re.I)]
    ignored = (REPO / "docker" / "Dockerfile.dockerignore").read_text().split()
    assert {".git", ".venv", "build"} <= set(ignored)


@pytest.mark.parametrize("package", ["engine_lib", "model_repository", "model_sets", "gateway", "rose_client", "rose_wire",
                                     "rose_triton", "scripts"])
def test_server_code_parses_as_the_images_python_310(package):
    for path in (REPO / package).rglob("*.py"):
        ast.parse(path.read_text(), str(path), feature_version=(3, 10))
