"""ModelRunner: one loaded model on one device; `step(PackedBatch) -> LazyTensor`."""
from __future__ import annotations

import contextlib
import logging

import numpy as np
import torch

from engine_lib.attention import AttentionShape, select_backend
from engine_lib.contract import LazyTensor, PackedBatch
from engine_lib.device.cpu_features import auto_cpu_bf16, bf16_pays
from engine_lib.device.cuda_env import check_cuda_fits
from engine_lib.device.lazy_tensor import CudaLazyTensor, ResolvedTensor
from engine_lib.model_folder import ModelFolder
from engine_lib.models import model_class
from engine_lib.models.cpu_linear import AUTO_MIN_WEIGHT_ELEMENTS, AUTO_PACKED_MAX_ROWS, pack_linears, use_onednn
from engine_lib.models.heads import build_head
from engine_lib.models.loader import allocate, load_weights
from engine_lib.models.pooling import pool
from engine_lib.retrieval import BGE_M3, COLBERT, ROW_DTYPE, ColbertConfig, retrieval_kind, special_token_ids
from engine_lib.runner import cpu_compile as compiler
from engine_lib.runner import self_check as probes
from engine_lib.runner.cuda_graphs import Capture, CudaGraphCapture, GraphBuckets, GraphRunner, GraphStats
from engine_lib.runner.inputs import INPUT_IDS, POSITIONS, SEQ_IDS, TOKEN_TYPES, step_inputs
from engine_lib.runner.ragged_outputs import RaggedResult, colbert_rows, expansion_key_lens, m3_rows, splade_rows
from engine_lib.runner.self_check import SelfCheckError

log = logging.getLogger(__name__)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
GRAPH_MODES = ("auto", "on", "off")


def resolve_device(name: str) -> torch.device:
    """auto | cpu | cuda | cuda:N (a Triton KIND_GPU instance's own GPU, rose_triton/parameters.py)."""
    if name == "auto" or name.startswith("cuda"):
        check_cuda_fits()  # a GPU node whose driver does not fit this torch fails here, naming both
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(f"device={name} was asked for but torch sees no CUDA device")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise RuntimeError(f"device={name}: torch sees {torch.cuda.device_count()} CUDA device(s)")
        device = torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)
    return device


def on_device(device: torch.device):
    """Make `device` current for this thread (CUDA's current device is per thread: the service
    steps from its own threads), so streams, graph pools and events made here live on it."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """auto: bfloat16 on CUDA, and on a CPU with native bf16 (engine_lib/device/cpu_features.py); else float32."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" or auto_cpu_bf16() else torch.float32
    return DTYPES[name]


class ModelRunner:
    """Loads the model folder, picks the attention backend, runs steps eagerly or through graphs.

    cuda_graphs: "auto" graphs on CUDA when the backend can be captured; "on"
    insists (with `graph_capture` injected it also runs on CPU, for tests);
    "off" always eager. Batches above (max_graph_seqs, max_graph_tokens) run eagerly.

    task: "embed" (pooled rows [num_seqs, hidden]) or "score" (one relevance
    logit per sequence, [num_seqs, 1]; `score_activation` says how it becomes
    the model's score). The head is chosen from config.json (models/heads.py).

    At load the built-in probe batch runs through the served path (warming lazily
    compiled kernels, e.g. FlashInfer's) and, in a half dtype, is checked against a
    float32 copy on the same device (self_check.py); `self_check_cosine` keeps the figure.
    dtype "auto": bfloat16 on CUDA, and on a CPU with native bf16 (resolve_dtype) for a model large
    enough to gain (cpu_features.bf16_pays); where `auto` chose bfloat16 on a CPU and the
    self-check refuses it, float32 serves instead (one log line).

    cpu_linear: "auto" packs every Linear for oneDNN once at load when on CPU and the
    probe passes (models/cpu_linear.py; else F.linear and one log line), "onednn"
    insists, "plain" keeps F.linear; `self.cpu_linear` says which path serves.

    cpu_compile: "auto" runs the layers through inductor on CPU (runner/cpu_compile.py; compiled at
    load, kernels cached under `compile_cache_dir`) when it compiles and gives the plain rows, else
    the plain forward and one log line; "on" insists; "off" never. `self.cpu_compile` says which serves.
    """

    def __init__(self, model: ModelFolder | str, device: str = "auto", dtype: str = "auto",
                 attention_backend: str = "auto", cuda_graphs: str = "auto",
                 max_graph_tokens: int = 4096, max_graph_seqs: int = 64, max_graphs: int | None = None,
                 graph_capture: Capture | None = None, task: str = "embed", self_check: bool = True,
                 cpu_linear: str = "auto", cpu_compile: str = "off", compile_cache_dir: str = ""):
        folder = model if isinstance(model, ModelFolder) else ModelFolder.open(model)
        self.model_dir = folder.path
        self.device = resolve_device(device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # this (loading) thread; step() sets it for the others
        settings = dict(attention_backend=attention_backend, cuda_graphs=cuda_graphs,
                        max_graph_tokens=max_graph_tokens, max_graph_seqs=max_graph_seqs, max_graphs=max_graphs,
                        graph_capture=graph_capture, task=task, self_check=self_check, cpu_linear=cpu_linear,
                        cpu_compile=cpu_compile, compile_cache_dir=compile_cache_dir)
        chosen = resolve_dtype(dtype, self.device)
        if dtype == "auto" and self.device.type == "cpu" and not bf16_pays(folder.config):
            chosen = torch.float32
        try:
            self._load(folder, chosen, **settings)
        except SelfCheckError as exc:
            if not (dtype == "auto" and self.device.type == "cpu" and chosen != torch.float32):
                raise
            log.warning("dtype=auto: %s; serving float32 instead", exc)
            self._load(folder, torch.float32, **settings)

    def _load(self, folder: ModelFolder, dtype: torch.dtype, attention_backend: str, cuda_graphs: str,
              max_graph_tokens: int, max_graph_seqs: int, max_graphs: int | None, graph_capture: Capture | None,
              task: str, self_check: bool, cpu_linear: str, cpu_compile: str, compile_cache_dir: str) -> None:
        self.dtype = dtype
        cfg = folder.config
        cls = model_class(cfg)
        self.attention_shape = AttentionShape.from_config(cfg, cls.is_causal(cfg))
        # Retrieval kinds (engine_lib/retrieval.py): each row is one TextOutputs object; eager steps only.
        self.retrieval_kind = retrieval_kind(folder) if task == "embed" else None
        self.colbert = ColbertConfig.of(folder) if self.retrieval_kind == COLBERT else None
        masks_expansion = self.colbert is not None and self.colbert.do_query_expansion and \
            not self.colbert.attend_to_expansion_tokens
        self.backend = select_backend(attention_backend, self.device, self.dtype, self.attention_shape,
                                      key_lens=masks_expansion)
        self._expansion_id = self.colbert.expansion_id if masks_expansion else None
        self.task = task
        self.vocab_size = cfg["vocab_size"]
        self.type_vocab_size = int(cfg.get("type_vocab_size", 1) or 1)
        self._cfg, self._cls, self._folder = cfg, cls, folder
        self.model, self.head = self._build_model(self.backend, self.dtype)
        self.ragged = bool(getattr(self.head, "ragged", False))
        self.row_dtype = ROW_DTYPE if self.ragged else np.float32
        self.dense_dim = self.head.output_dim
        self.multivector_dim = getattr(self.head, "multivector_dim", 0)
        if self.retrieval_kind == BGE_M3:
            self._dropped_ids = np.asarray(special_token_ids(folder), dtype=np.int64)
        if self.colbert is not None:
            self._dropped_ids = np.asarray(self.colbert.skiplist_ids, dtype=np.int64)
        self.cpu_linear = "onednn" if use_onednn(cpu_linear, self.device, self.dtype) else "plain"
        self.packed_layers = 0
        if self.cpu_linear == "onednn":  # auto: the layers large enough to gain, for the inputs that gain
            smallest, rows = (AUTO_MIN_WEIGHT_ELEMENTS, AUTO_PACKED_MAX_ROWS) if cpu_linear == "auto" else (0, None)
            self.packed_layers = pack_linears(self.model, smallest, rows) + pack_linears(self.head, smallest, rows)
        self._layers = self.model  # what _forward_static runs: the model, or its compiled forward
        self.cpu_compile = "off"
        if compiler.wanted(cpu_compile, self.device):
            self._compile(cpu_compile == "on", compile_cache_dir)
        self.output_dim = 1 if self.ragged else self.head.output_dim
        self.score_activation = self.head.activation
        self.pooling = getattr(self.head, "mode", None)
        self.max_positions = self.model.max_positions
        self.hidden_size = cfg["hidden_size"]
        self._copy_stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self.stats = GraphStats()
        self._graph_settings = (cuda_graphs, max_graphs, graph_capture)
        self.graphs = self._graph_runner(cuda_graphs, max_graph_tokens, max_graph_seqs, max_graphs, graph_capture)
        self.self_check_cosine = self._self_check(torch.float32 if self_check else self.dtype)

    def set_graph_grid(self, max_tokens: int, max_seqs: int) -> None:
        """Resize the graph grid (before serving: graphs captured so far are dropped)."""
        if self.graphs is not None:
            mode, max_graphs, capture = self._graph_settings
            self.graphs = self._graph_runner(mode, max_tokens, max_seqs, max_graphs, capture)

    def _build_model(self, backend, dtype: torch.dtype) -> tuple[torch.nn.Module, torch.nn.Module]:
        """(layers, head) from the folder's weights, on the device in `dtype`."""
        weight_files = self._folder.weight_files
        with torch.device("meta"):
            model = self._cls(self._cfg, backend)
            head = build_head(self.task, self._folder)
        model, head = allocate(model), allocate(head)
        load_weights(model, weight_files)
        head.load(weight_files)
        model = model.to(device=self.device, dtype=dtype).eval()
        head = head.to(device=self.device, dtype=dtype).eval()
        if hasattr(model, "init_buffers"):
            model.init_buffers()  # non-checkpoint buffers (RoPE table), in fp32 on the device
        return model, head

    @torch.inference_mode()
    def _self_check(self, reference_dtype: torch.dtype) -> float:
        """Probe batch through the served path (warm-up); then, when the served dtype differs from
        `reference_dtype`, the probes' mean-pooled final hidden states vs a `reference_dtype` copy
        (the layers are what the dtype changes; a score head's single logit is no vector to compare)."""
        batch = probes.probe_batch(self.vocab_size, self.max_positions)
        warm = self.forward_eager(batch)
        for tensor in warm.values() if self.ragged else (warm,):
            tensor.cpu()
        if self.dtype == reference_dtype:
            return 1.0
        served = self._probe_rows(self.model, self.backend, batch)
        backend = select_backend("sdpa", self.device, reference_dtype, self.attention_shape)
        model, _ = self._build_model(backend, reference_dtype)
        reference = self._probe_rows(model, backend, batch)
        del model
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        return probes.check(served, reference, str(self.dtype).removeprefix("torch."), self.device.type)

    def _probe_rows(self, model, backend, batch: PackedBatch) -> np.ndarray:
        inputs = step_inputs(batch, self.device)
        plan = backend.plan(batch.cu_seqlens, batch.max_seqlen, self.device)
        hidden = self._hidden(model, inputs.token_data, plan)
        rows = pool(hidden, inputs.cu_seqlens, inputs.token_data[SEQ_IDS], "mean")
        return rows.float().cpu().numpy()

    @torch.inference_mode()
    def _compile(self, insist: bool, cache_dir: str) -> None:
        """Compile the layers on the probe batch and on it less its last sequence (two token counts:
        symbolic from then on, runner/cpu_compile.py); keep them if they give the plain forward's rows."""
        batch = probes.probe_batch(self.vocab_size, self.model.max_positions)
        shorter = PackedBatch.from_flat(batch.input_ids[:batch.cu_seqlens[-2]], np.diff(batch.cu_seqlens)[:-1])
        try:
            forward = compiler.compile_layers(self.model, self.backend, cache_dir)
            cosine = min(self._compare(forward.compile_first, b) for b in (batch, shorter))
        except Exception as exc:  # noqa: BLE001 - any compiler failure (no C compiler, inductor error) falls back
            if insist:
                raise RuntimeError(f"cpu_compile=on: compiling the CPU forward failed ({exc!r})") from exc
            log.warning("cpu_compile=auto: the plain forward serves (compiling failed: %r)", exc)
            return
        if not cosine >= compiler.MIN_COSINE:
            if insist:
                raise RuntimeError(f"cpu_compile=on: the compiled forward's rows differ (cosine {cosine:.6f})")
            log.warning("cpu_compile=auto: the plain forward serves (compiled rows differ, cosine %.6f)", cosine)
            return
        self._layers, self.cpu_compile = forward, "on"

    def _compare(self, layers, batch: PackedBatch) -> float:
        """Smallest cosine between `layers`' and the plain model's hidden state of any token of `batch`."""
        inputs = step_inputs(batch, self.device)
        plan = self.backend.plan(batch.cu_seqlens, batch.max_seqlen, self.device)
        got, want = (self._hidden(m, inputs.token_data, plan).float().numpy() for m in (layers, self.model))
        return float(probes.row_cosines(got, want).min())

    def _graph_runner(self, mode: str, max_tokens: int, max_seqs: int, max_graphs: int | None,
                      capture: Capture | None) -> GraphRunner | None:
        if mode not in GRAPH_MODES:
            raise ValueError(f"cuda_graphs must be one of {GRAPH_MODES}, got {mode!r}")
        possible = self.backend.supports_graphs and (self.device.type == "cuda" or capture is not None)
        if mode == "off" or (mode == "auto" and not possible) or self.ragged:  # ragged heads: eager only
            return None
        if not possible:
            raise ValueError(f"cuda_graphs=on needs CUDA and a capturable attention backend (masked, varlen, "
                             f"flashinfer); have {self.device.type} and {self.backend.name!r}")
        capture = capture or CudaGraphCapture(self.device)
        seqlen_cap = self.max_positions if self.backend.graph_keys_max_seqlen else None
        buckets = GraphBuckets(max_tokens, max_seqs, max_seqlen_cap=seqlen_cap)
        return GraphRunner(self._forward_static, self.backend, buckets, self.device, capture, self.stats, max_graphs)

    def _hidden(self, model, token_data: torch.Tensor, plan) -> torch.Tensor:
        """Final hidden states [num_tokens, hidden] over runner/inputs.py's [4, num_tokens] token buffer."""
        token_types = token_data[TOKEN_TYPES] if self.type_vocab_size > 1 else None
        return model(token_data[INPUT_IDS], token_data[POSITIONS], plan, token_types)

    def _forward_static(self, token_data: torch.Tensor, cu_seqlens: torch.Tensor, plan) -> torch.Tensor:
        hidden = self._hidden(self._layers, token_data, plan)
        out = self.head(hidden, cu_seqlens, token_data[SEQ_IDS])
        return out if self.ragged else out.float()  # [num_seqs, output_dim] (ragged heads: a dict)

    def forward_eager(self, batch: PackedBatch) -> torch.Tensor:
        inputs = step_inputs(batch, self.device)
        key_lens = None if self._expansion_id is None else expansion_key_lens(batch, self._expansion_id)
        plan = (self.backend.plan(batch.cu_seqlens, batch.max_seqlen, self.device) if key_lens is None else
                self.backend.plan(batch.cu_seqlens, batch.max_seqlen, self.device, key_lens=key_lens))
        return self._forward_static(inputs.token_data, inputs.cu_seqlens, plan)

    @torch.inference_mode()
    def step(self, batch: PackedBatch) -> LazyTensor:
        """Launch the forward pass; returns fp32 [num_seqs, output_dim] (pooled, not normalised; or logits)."""
        with on_device(self.device):
            if self.ragged:
                self.stats.eager_runs += 1
                return RaggedResult(self.forward_eager(batch), self._ragged_builder(batch))
            pooled = self.graphs.run(batch) if self.graphs is not None else None
            if pooled is None:
                self.stats.eager_runs += 1
                pooled = self.forward_eager(batch)
            if self.device.type == "cuda":
                return CudaLazyTensor(pooled, self._copy_stream)
        return ResolvedTensor(pooled.numpy())

    def _ragged_builder(self, batch: PackedBatch):
        """host outputs -> list[TextOutputs] for `batch` (runner/ragged_outputs.py)."""
        if self.retrieval_kind == BGE_M3:
            return lambda host: m3_rows(host, batch, self._dropped_ids)
        if self.retrieval_kind == COLBERT:
            return lambda host: colbert_rows(host, batch, self._dropped_ids)
        return lambda host: splade_rows(host, batch)
