"""`python -m perf run|setup|report|readme` (see docs/benchmarks.md)."""
from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from . import lineup, machine, report, runner
from .profiles import PROFILES, RUNNERS, select

REPO = lineup.REPO


def start_targets(names: list[str], args, model: dict, stack) -> tuple[dict, str | None]:
    """(targets by name, the gRPC URL of ours, if served)."""
    targets = {}
    grpc_url, gateway_url = args.grpc_url, args.gateway_url
    if not grpc_url and {"rose", "triton-padded"} & set(names) or not gateway_url and "gateway" in names:
        from rose_triton.server import TritonServer

        extra = ["--model-repository", str(lineup.BASELINES)] if "triton-padded" in names else []
        log_dir = Path(tempfile.mkdtemp(prefix="perf-triton-"))
        runner.log(f"starting tritonserver (log {log_dir / 'server.log'})")
        env = {"ROSE_MODEL_DIR": model["dir"]} if args.model_dir else {}
        serve_args = ["--rerank-model-dir", args.rerank_model_dir] if args.rerank_model_dir else []
        server = TritonServer(log_dir / "server.log", env=env, extra_args=extra, ready_timeout=600,
                              serve_args=serve_args, gateway="gateway" in names)
        stack.append(server.stop)
        grpc_url, gateway_url = grpc_url or server.grpc_url, gateway_url or server.gateway_url
    for name in names:
        try:
            if name == "rose":
                targets[name] = lineup.rose_target(grpc_url)
            elif name == "gateway":
                targets[name] = lineup.gateway_target(gateway_url)
            elif name == "triton-padded":
                targets[name] = lineup.triton_padded_target(grpc_url)
            elif name == "st":
                targets[name] = lineup.InprocTarget(name, sys.executable, "st", model["dir"], model["max_positions"])
            elif name == "ort":
                from .setup_peers import ensure_onnx_export

                export = ensure_onnx_export(model["dir"])
                targets[name] = lineup.InprocTarget(name, lineup.peer_python("ort"), "ort", str(export),
                                                    model["max_positions"])
            elif name in ("vllm", "vllm-2cores", "infinity"):
                from .peers.servers import start_openai_peer

                targets[name] = start_openai_peer(name, model, stack)
            else:
                raise SystemExit(f"unknown target {name!r}; known: {', '.join(lineup.LABELS)}")
        except (FileNotFoundError, RuntimeError, subprocess.CalledProcessError) as exc:
            runner.log(f"target {name} not available, left out: {exc}")
            continue
        if hasattr(targets[name], "close"):
            stack.append(targets[name].close)
    return targets, grpc_url


def start_scoring(args, names: list[str], grpc_url: str | None, stack) -> dict | None:
    """Reranker targets, requests and reference for score cells (perf/scoring.py), or None."""
    if not args.rerank_model_dir:
        return None
    from engine_lib.model_folder import ModelFolder

    from .scoring import PairRequests, ScoreReference, score_targets

    folder = ModelFolder.open(args.rerank_model_dir)
    requests = PairRequests(folder.path)
    targets = score_targets(names, grpc_url, folder.path, requests.pairs.max_length)
    for target in targets.values():
        if hasattr(target, "close"):
            stack.append(target.close)
    info = {"dir": folder.path, "name": args.rerank_label or Path(folder.path).name,
            "architectures": folder.config.get("architectures"),
            "config": {k: folder.config[k] for k in ("hidden_size", "num_hidden_layers") if k in folder.config}}
    return {"info": info, "requests": requests, "reference": ScoreReference(folder.path), "targets": targets}


def plot(json_path: Path) -> None:
    python = lineup.PEERS / "plot" / "bin" / "python"
    if not python.exists():
        runner.log("no plots: run `python -m perf setup plot` (matplotlib in its own venv)")
        return
    subprocess.run([str(python), "-m", "perf.plots", str(json_path)], cwd=REPO, check=False,
                   env={**os.environ, "PYTHONPATH": str(REPO)})


def _exit_on_sigterm(signum, frame):
    raise SystemExit(f"stopped by signal {signum}")  # so the finally below stops every server it started


def run_cells(args, profile, out_json: Path, desc: dict) -> dict:
    """A profile of cells: every target (ours served, peers) on the same requests, checked, then timed."""
    names = args.targets.split(",") if args.targets else list(profile.default_targets)
    cells = select(profile.cells, args.cells, args.scale)
    model = lineup.model_info(args.model_dir)
    runner.log(f"profile {profile.name}: {len(cells)} cells, targets {names} -> {out_json}")
    gemm = machine.gemm_flops() if not args.no_gemm else None
    if gemm:
        runner.log(f"GEMM: {gemm['flops_per_s'] / 1e9:.1f} GFLOP/s ({gemm['dtype']}, n={gemm['n']})")
    stack: list = []
    try:
        targets, grpc_url = start_targets(names, args, model, stack)
        scoring = start_scoring(args, names, grpc_url, stack)
        results = runner.run_profile(profile, cells, targets, model, desc, out_json,
                                     {"gemm": gemm, "scale": args.scale}, (args.quiet_busy, args.quiet_wait),
                                     scoring)
        for name in results["targets"]:
            results["targets"][name]["label"] = lineup.LABELS.get(name, name)
        if gemm:  # again at the end; the better reading is the less disturbed one
            again = machine.gemm_flops()
            results["gemm"] = max(gemm, again, key=lambda g: g["flops_per_s"])
    finally:
        for stop in reversed(stack):
            try:
                stop()
            except Exception as exc:  # shutting down: report, keep closing the rest
                runner.log(f"while stopping: {exc}")
    return results


def cmd_run(args) -> None:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    desc = machine.describe()
    out_dir = Path(args.out) if args.out else REPO / "perf" / "results" / machine.slug(desc)
    out_dir.mkdir(parents=True, exist_ok=True)
    out_json = out_dir / f"{args.profile}.json"
    if args.quiet_wait:
        desc["cpu_busy_before"] = machine.wait_until_quiet(args.quiet_busy, args.quiet_wait)
        runner.log(f"machine busy: {desc['cpu_busy_before']:.0%} of all cores")
    if args.profile in RUNNERS:
        results = importlib.import_module(RUNNERS[args.profile]).measure(args, out_json, desc)
    else:
        results = run_cells(args, PROFILES[args.profile], out_json, desc)
    out_json.write_text(json.dumps(results, indent=1))
    text = report.markdown(results)
    out_json.with_suffix(".md").write_text(text)
    if not args.no_plots:
        plot(out_json)
    runner.log(f"wrote {out_json} and {out_json.with_suffix('.md')}")
    print(text)
    if results.get("ok") is False:
        raise SystemExit(f"profile {args.profile}: its checks failed (see {out_json})")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m perf", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a profile against ours and peers")
    run.add_argument("--profile", choices=sorted([*PROFILES, *RUNNERS]), default="cpu",
                     help="cells against served targets (perf/profiles.py) or in-process runs: overhead (the "
                          "server's own cost per request), engine-cpu, gpu-served, gpu-latency; mix (bulk + "
                          "interactive, priority classes on and off) (docs/benchmarks.md)")
    run.add_argument("--targets", help=f"comma list (default: the profile's); known: {','.join(lineup.LABELS)}")
    run.add_argument("--cells", help="comma list of cell keys (default: all); overhead profile: client paths")
    run.add_argument("--dry-run", action="store_true",
                     help="gpu-served, gpu-latency: a tiny model on CPU, small sizes (checks the profile itself; CI)")
    run.add_argument("--scale", type=float, default=1.0, help="scale request counts and durations (e.g. 0.2)")
    run.add_argument("--grpc-url", help="use a running server (ours) instead of starting one")
    run.add_argument("--gateway-url", help="use a running gateway (e.g. http://127.0.0.1:8080) for target gateway")
    run.add_argument("--model-dir", help="model folder (default: the embedded all-MiniLM-L6-v2)")
    run.add_argument("--rerank-model-dir", help="reranker folder: also serve it and run the score cells (2r)")
    run.add_argument("--rerank-label", help="name of the reranker in the results (e.g. '... random-weight')")
    run.add_argument("--out", help="output folder (default: perf/results/<date>-<machine>)")
    run.add_argument("--compare", help="overhead profile: also serve these git refs (comma list), same run")
    run.add_argument("--variant", action="append", metavar="LABEL=REF[:KEY=VALUE...]",
                     help="overhead profile: also serve REF (. = this checkout) with KEY=VALUE in its environment")
    run.add_argument("--server-env", action="append", metavar="KEY=VALUE",
                     help="mix profile: launcher environment of the server it starts (e.g. ROSE_MAX_BATCH_TOKENS=2048)")
    run.add_argument("--no-plots", action="store_true")
    run.add_argument("--no-gemm", action="store_true")
    run.add_argument("--quiet-wait", type=float, default=120.0,
                     help="before each timing, wait up to this many seconds for the machine to be under "
                          "--quiet-busy (other work on shared machines skews numbers); 0 = never wait")
    run.add_argument("--quiet-busy", type=float, default=0.25, help="busy fraction of all cores counted as quiet")
    setup = sub.add_parser("setup", help="install a peer (ort, plot, vllm, infinity, perf-analyzer)")
    setup.add_argument("name")
    setup.add_argument("--model-dir")
    rep = sub.add_parser("report", help="re-render markdown and plots from a results JSON")
    rep.add_argument("json", type=Path)
    readme = sub.add_parser("readme", help="regenerate README's Performance table from results JSON files")
    readme.add_argument("json", type=Path, nargs="+")
    args = parser.parse_args(argv)
    if args.command == "run" and args.dry_run and not args.profile.startswith("gpu-"):
        parser.error("--dry-run is for the gpu-served and gpu-latency profiles")
    if args.command == "run":
        cmd_run(args)
    elif args.command == "setup":
        from .setup_peers import setup as do_setup

        do_setup(args.name, lineup.model_info(args.model_dir)["dir"])
    elif args.command == "report":
        results = json.loads(args.json.read_text())
        args.json.with_suffix(".md").write_text(report.markdown(results))
        plot(args.json)
    elif args.command == "readme":
        report.update_readme(REPO / "README.md", report.readme_section([p.resolve() for p in args.json], REPO))


if __name__ == "__main__":
    main()
