"""The servers of one overhead run: this checkout, and optionally older commits, each its own tritonserver."""
from __future__ import annotations

import os
import secrets
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .procstat import find_named

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Variant:
    name: str              # "current", a git ref, or a label given with --variant
    root: Path
    env: dict = field(default_factory=dict)  # extra server environment (e.g. ROSE_NUM_THREADS)
    server: object = None  # rose_triton.server.TritonServer
    admin_key: str = field(default_factory=lambda: secrets.token_hex(16))
    triton_pid: int | None = None


def export_ref(ref: str, parent: Path) -> Path:
    """The tree of commit `ref` in a fresh folder (git archive: no worktree is registered); build/ shared."""
    commit = subprocess.run(["git", "rev-parse", "--short", ref], cwd=REPO, capture_output=True, text=True,
                            check=True).stdout.strip()
    dest = Path(tempfile.mkdtemp(prefix=f"rose-{commit}-", dir=parent))
    archive = subprocess.run(["git", "archive", commit], cwd=REPO, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    (dest / "build").symlink_to(REPO / "build")
    return dest


def start(variants: list[Variant], model_dir: str, extra_repositories: list[Path], log_dir: Path,
          log) -> None:
    """Start every variant's server (the first also serves `extra_repositories`)."""
    from rose_triton.server import TritonServer

    for i, variant in enumerate(variants):
        extra = [a for repo in (extra_repositories if i == 0 else []) for a in ("--model-repository", str(repo))]
        log(f"starting tritonserver for {variant.name} ({variant.root}; log {log_dir / (variant.name + '.log')})")
        variant.server = TritonServer(log_dir / f"{variant.name.replace('/', '_')}.log",
                                      env={"ROSE_MODEL_DIR": model_dir, "ROSE_WATCHDOG": "0", **variant.env},
                                      extra_args=extra,
                                      ready_timeout=600,
                                      admin_key=variant.admin_key, root=variant.root)
        variant.triton_pid = find_named(variant.server.process.pid, "tritonserver")
        if variant.triton_pid is None:
            raise RuntimeError(f"{variant.name}: no tritonserver process under pid {variant.server.process.pid}")


def stop(variants: list[Variant], log) -> None:
    for variant in variants:
        if variant.server is not None:
            try:
                variant.server.stop()
            except Exception as exc:  # shutting down: report, keep stopping the rest
                log(f"while stopping {variant.name}: {exc}")


def parse_variant(text: str, work: Path) -> Variant:
    """`LABEL=REF[:KEY=VALUE...]`: REF "." is this checkout; KEY=VALUE go into the server's environment."""
    label, _, rest = text.partition("=")
    ref, *pairs = rest.split(":")
    if not label or not ref or any("=" not in p for p in pairs):
        raise SystemExit(f"--variant {text!r}: expected LABEL=REF[:KEY=VALUE...] (REF . = this checkout)")
    root = REPO if ref == "." else export_ref(ref, work)
    return Variant(label, root, dict(p.split("=", 1) for p in pairs))


def variants_for(compare: list[str], extra: list[str], work: Path) -> list[Variant]:
    """"current" (this checkout, as configured) first: it also serves the floor and the padded baseline."""
    return ([Variant("current", REPO)] + [Variant(ref, export_ref(ref, work)) for ref in compare]
            + [parse_variant(v, work) for v in extra])


def machine_env() -> dict:
    return {k: os.environ[k] for k in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "ROSE_VENV") if k in os.environ}
