"""`python -m perf run|setup|report|readme-table` (docs/benchmarks.md)."""
from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
from pathlib import Path

from engine_lib.model_folder import ModelFolder

from . import REPO, RESULTS, machine, report
from .peers.setup import setup
from .profiles import LABELS, MODULES


def profile_module(profile: str):
    """The module that measures and renders `profile` (imported on demand: each pulls in its own stack)."""
    return importlib.import_module(MODULES[profile.removesuffix("-dry-run")])


def _exit_on_sigterm(signum, frame):
    raise SystemExit(f"stopped by signal {signum}")  # so that every `finally` stops the servers it started


def cmd_run(args) -> None:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    desc = machine.describe()
    out_dir = Path(args.out) if args.out else RESULTS / machine.slug(desc)
    out_dir.mkdir(parents=True, exist_ok=True)
    out_json = out_dir / f"{args.profile}.json"
    if args.quiet_wait:
        desc["cpu_busy_before"] = machine.wait_until_quiet(args.quiet_busy, args.quiet_wait)
    module = profile_module(args.profile)
    results = module.measure(args, out_json, desc)
    out_json.write_text(json.dumps(results, indent=1))
    text = module.markdown(results)
    out_json.with_suffix(".md").write_text(text)
    print(text)
    print(f"[perf] wrote {out_json} and {out_json.with_suffix('.md')}")
    if results.get("ok") is False:
        raise SystemExit(f"profile {args.profile}: its checks failed (see {out_json})")


def model_dir_arg(value: str) -> str:
    """--model-dir: an existing folder as an absolute path (servers of --compare refs start in their
    own worktrees), anything else as given (a model name such as `default`)."""
    return os.path.abspath(value) if os.path.isdir(value) else value


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m perf", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a profile: ours and peers in the same run (docs/benchmarks.md)")
    run.add_argument("--profile", choices=sorted(MODULES), default="cpu")
    run.add_argument("--targets", help=f"comma list (default: the profile's); known: {','.join(LABELS)}")
    run.add_argument("--cells", help="comma list of cell keys (default: all); overhead: client paths; "
                                     "perf_analyzer: entries")
    run.add_argument("--scale", type=float, default=1.0, help="scale request counts and durations (e.g. 0.2)")
    run.add_argument("--dry-run", action="store_true", help="gpu-served: a tiny model on CPU, small sizes (CI)")
    run.add_argument("--grpc-url", help="use a running server (ours) instead of starting one")
    run.add_argument("--gateway-url", help="use a running gateway (e.g. http://127.0.0.1:8080) for target gateway")
    run.add_argument("--model-dir", type=model_dir_arg, help="model folder (default: the embedded all-MiniLM-L6-v2)")
    run.add_argument("--out", help="output folder (default: perf/results/<machine>)")
    run.add_argument("--compare", help="overhead: also serve these git refs (comma list), same run; the ref "
                                       "`traces`: this tree with traces on, every request sampled; perf_analyzer: the same sweep "
                                       "on a server of each ref, cell by cell")
    run.add_argument("--clients", help="overhead: concurrent clients of the load cells (default 1,8); "
                                      "perf_analyzer: its concurrency values (default 1,4,16,64,128)")
    run.add_argument("--server-env", action="append", metavar="KEY=VALUE",
                     help="environment of our server the run starts (e.g. ROSE_DTYPE=bfloat16); every "
                          "profile but overhead, perf_analyzer and gpu-served")
    run.add_argument("--rounds", type=int, default=1,
                     help="cells profiles: a sequential (latency) cell's requests in this many rounds, the "
                          "targets taking turns, so that drift hits them alike (default 1: one target after another)")
    run.add_argument("--admin-key", help="perf_analyzer with --grpc-url: the server's admin key")
    run.add_argument("--no-gemm", action="store_true", help="skip the dense-GEMM reading")
    run.add_argument("--quiet-wait", type=float, default=120.0,
                     help="before each timing, wait up to this many seconds for the machine to be under "
                          "--quiet-busy (other work on shared machines skews numbers); 0 = never wait")
    run.add_argument("--quiet-busy", type=float, default=0.25, help="busy fraction of all cores counted as quiet")
    peer = sub.add_parser("setup", help="install a peer (ort, vllm, infinity, perf-analyzer)")
    peer.add_argument("name")
    peer.add_argument("--model-dir", type=model_dir_arg)
    rep = sub.add_parser("report", help="re-render the markdown of a results JSON")
    rep.add_argument("json", type=Path)
    table = sub.add_parser("readme-table", help="print the README's performance table from perf/results/")
    table.add_argument("--write", action="store_true", help="replace the table in README.md")
    args = parser.parse_args(argv)
    if args.command == "run":
        if args.dry_run and not args.profile.startswith("gpu-"):
            parser.error("--dry-run is for the gpu-served profile")
        cmd_run(args)
    elif args.command == "setup":
        setup(args.name, ModelFolder.open(args.model_dir or "default").path)
    elif args.command == "report":
        results = json.loads(args.json.read_text())
        args.json.with_suffix(".md").write_text(profile_module(results["profile"]).markdown(results))
    elif args.write:
        report.write_readme_table(REPO / "README.md", report.readme_table(RESULTS, REPO))
    else:
        print(report.readme_table(RESULTS, REPO), end="")


if __name__ == "__main__":
    main()
