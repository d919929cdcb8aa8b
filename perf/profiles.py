"""Every profile of `python -m perf run`: cells against served targets (`PROFILES`: `seed` with the seed's
GPU numbers, `cpu` scaled, `served-vs-st`, `gateway`), and profiles run by their own module (`RUNNERS`)."""
from __future__ import annotations

from dataclasses import dataclass, field


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
    task: str = "embed"      # "score": a reranker (query + `batch` documents; seq_len = tokens per pair)

    def __post_init__(self):
        if self.mode not in ("sequential", "load") or self.input not in ("tokens", "text"):
            raise ValueError(f"cell {self.key}: bad mode/input {self.mode}/{self.input}")
        if self.metric not in ("p50_ms", "embeddings_per_s"):
            raise ValueError(f"cell {self.key}: bad metric {self.metric}")
        if self.task not in ("embed", "score"):
            raise ValueError(f"cell {self.key}: bad task {self.task}")

    @property
    def label(self) -> str:
        conc = f", {self.concurrency} clients" if self.mode == "load" else ""
        if self.task == "score":
            return f"pairs len {self.seq_len}, {self.batch} documents"
        return f"{self.input} len {self.seq_len}, batch {self.batch}{conc}"

    def scaled(self, factor: float) -> "Cell":
        from dataclasses import replace

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


S1, S2, S3, S4 = ("1 low-latency embedding", "2 low-latency scoring", "3 high-throughput embedding",
                  "4 high-concurrency embedding")
RERANK_NOTE = ("Scenario 2r runs on the reranker given with --rerank-model-dir: ours streams pre-tokenized "
               "(query, document) pairs to `rerank_encoder`; the `st` column there is sentence-transformers "
               "CrossEncoder.predict in-process on the same pairs. Without a reranker those cells are skipped.")

S2R = "2r low-latency scoring, reranker (needs --rerank-model-dir)"


def _rerank_cells(pair_len: int, batches, num_requests: int, max_seconds: float) -> tuple[Cell, ...]:
    """The seed's scoring scenario on a reranker: one query and N documents, pre-tokenized pairs."""
    return tuple(Cell(S2R, f"s2r-batch{b}", "sequential", "tokens", pair_len, b, num_requests=num_requests,
                      max_seconds=max_seconds, task="score") for b in batches)


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
                   n1=1000, n2=300, d3=60, d4=30, max1=180, max2=180)
        + _rerank_cells(512, (5, 25, 50), 300, 180),
        ("rose", "st", "ort", "triton-padded", "vllm", "infinity"), warmup_requests=8, pool_requests=32,
        notes=("Cells longer than the served model's maximum are skipped and say so; use --model-dir for a "
               "longer-context model.", RERANK_NOTE)),
    "cpu": Profile(
        "cpu", "The seed's four scenarios scaled to the default model (max 256 tokens) and a 2-core CPU.",
        _seed_like((32, 128, 256, "mixed"), 128, (5, 25, 50), 32, (128, 256, "mixed"), 128, (1, 2, 4, 8, 16),
                   n1=200, n2=30, d3=20, d4=10, max1=30, max2=30)
        + _rerank_cells(128, (5, 25, 50), 30, 30),
        ("rose", "st", "ort", "triton-padded"),
        notes=("Scaled from the seed: lengths 128/512/4096 -> 32/128/256 (+ mixed 8..256); scoring at 128 "
               "tokens; throughput requests of 32 texts (seed: 100); concurrency at 128 tokens (seed: 512).",
               "On a 2-core machine the server, its client processes and in-process peers share the same "
               "cores; served targets pay for their clients, in-process peers do not.", RERANK_NOTE)),
    "served-vs-st": Profile(
        "served-vs-st", "Served ensemble (text in, over gRPC) vs sentence-transformers encode in-process, same texts.",
        (Cell("latency", "lat-128", "sequential", "text", 128, 1, num_requests=200, max_seconds=60),
         Cell("throughput", "tput-256-c1", "load", "text", 256, 32, 1, duration_s=20, metric="embeddings_per_s"),
         Cell("throughput", "tput-256-c4", "load", "text", 256, 32, 4, duration_s=20, metric="embeddings_per_s")),
        ("rose", "st"),
        notes=("Text in for both: ours through the `ensemble` over gRPC streaming (tokenization in the server), "
               "sentence-transformers `encode` in-process (no server, no network hop).",
               "4 concurrent clients: 4 client processes for the server, 4 threads sharing one model in-process.",
               "On a 2-core machine the server and its client processes share the same cores.")),
    "gateway": Profile(
        "gateway", "Scenario 4 (high concurrency, text in) through the OpenAI-compatible gateway vs gRPC "
                   "streaming on the ensemble, plus batch-1 latency to read the gateway's own cost.",
        (Cell("latency", "lat-text-128", "sequential", "text", 128, 1, num_requests=200, max_seconds=30),
         Cell("latency", "lat-tokens-128", "sequential", "tokens", 128, 1, num_requests=200, max_seconds=30),
         *(Cell(S4, f"s4-c{c}", "load", "text", 128, 1, c, duration_s=10, served_only=True) for c in (1, 4, 16, 64))),
        ("rose", "gateway"),
        notes=("gateway, text in: HTTP JSON -> the gateway tokenizes -> rose_encoder over gRPC streaming; rose, "
               "text in: gRPC streaming on `ensemble` (tokenizer model + encoder). Token-id cells: the gateway gets "
               "the ids as JSON lists, rose sends them straight to rose_encoder.",
               "The gateway's own added latency per request is p50(gateway, tokens) - p50(rose, tokens); "
               "text in it also tokenizes (and skips the ensemble's tokenizer hop).",
               "vLLM and Infinity join with --targets rose,gateway,vllm,infinity (their own OpenAI endpoints).",
               "On a 2-core machine the server, the gateway and the client processes share the same cores.")),
}

# Profiles run by their own module, `measure(args, out_json, machine) -> results` (the same results format,
# rendered by perf/report.py), instead of cells against served targets.
RUNNERS = {
    "overhead": "perf.overhead.run",     # the server's own cost per request, next to a near-free model
    "engine-cpu": "perf.engine.cpu",     # ModelRunner.step vs ONNX Runtime; model FLOP/s vs GEMM, no server
    "gpu-served": "perf.engine.served",  # Endpoint + BatchingService + CUDA graphs under concurrent load
    "gpu-latency": "perf.engine.latency",  # batch 1: graphs vs eager vs HF transformers
    "mix": "perf.mix",                   # bulk backfill + interactive stream, priority classes on and off
}
