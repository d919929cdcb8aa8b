"""Construction: an Endpoint (engine + service) from an EncoderConfig."""
from __future__ import annotations

import logging
import os
from typing import Callable, Optional

from engine_lib.config import AUTO, EncoderConfig
from engine_lib.contract import RaggedTokens
from engine_lib.model_folder import folder_fingerprint
from engine_lib.runner.compute_thread import ComputeThread, bound_openmp_spinning
from engine_lib.runner.step_threads import StepThreads, flops_per_token
from engine_lib.service.batching import BatchingService
from engine_lib.service.calibration import Calibration, cache_key, default_cache_dir
from engine_lib.service.endpoint import Endpoint
from engine_lib.service.scheduler import backfill_budget, batch_class_budget

log = logging.getLogger(__name__)


def calibration_for(engine, cache_dir: str, sequences: Callable[[str], RaggedTokens]) -> Calibration:
    """The engine's int8 calibration: `sequences(model_dir)` tokenizes the calibration texts
    (engine_lib/tokenization/calibration.py); rows cached under `cache_dir` ("" = default_cache_dir())."""
    directory = os.path.join(cache_dir or default_cache_dir(), "calibration")
    kind = f"{engine.device.type}:{engine.dtype}"

    def cache_file(seqs: RaggedTokens) -> str:
        return os.path.join(directory, cache_key(folder_fingerprint(engine.model_dir), seqs, kind) + ".npy")

    return Calibration(lambda: sequences(engine.model_dir), cache_file)


def build_endpoint(config: EncoderConfig, calibration_sequences: Optional[Callable[[str], RaggedTokens]] = None,
                   **engine_options) -> Endpoint:
    """`engine_options` go to ModelRunner as they are (tests and the GPU check inject a graph capture).
    `calibration_sequences(model_dir)`: the int8 calibration's token ids (embedding task only; None: no
    int8/uint8 outputs). The engine is loaded and timed on the thread that then runs its steps
    (runner/compute_thread.py), whose OpenMP workers spin briefly when torch loads first here."""
    bound_openmp_spinning()
    compute = ComputeThread("rose-scheduler")
    try:
        engine, budgets = compute.call(_load_engine, config, engine_options)
        calibration = None
        if calibration_sequences is not None and config.task == "embed":
            calibration = calibration_for(engine, config.cache_dir, calibration_sequences)
        max_batch_tokens, batch_class_tokens, backfill_tokens = budgets
        service = BatchingService(engine, max_batch_tokens, config.max_batch_sequences,
                                  config.max_inflight_batches, config.max_queued_tokens,
                                  config.max_queued_requests, batch_promote_s=config.batch_promote_ms / 1000,
                                  max_batch_class_tokens=batch_class_tokens, max_backfill_tokens=backfill_tokens,
                                  scheduler_thread=compute)
    except BaseException:
        compute.close()
        raise
    return Endpoint(service, calibration=calibration)


def _load_engine(config: EncoderConfig, engine_options: dict):
    """(engine, (max_batch_tokens, batch-class tokens, backfill tokens)): the model loaded, its budgets timed."""
    import torch

    from engine_lib.runner.batch_budget import LADDER_MAX, auto_batch_tokens, step_bounded_tokens, timing_alone
    from engine_lib.runner.model_runner import ModelRunner

    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    engine = ModelRunner(config.model_dir, device=config.device, dtype=config.dtype,
                         attention_backend=config.attention_backend, cuda_graphs=config.cuda_graphs,
                         max_graphs=config.max_graphs, task=config.task, self_check=config.self_check,
                         cpu_linear=config.cpu_linear, cpu_compile=config.cpu_compile,
                         compile_cache_dir=config.cache_dir or default_cache_dir(),
                         **engine_options)
    # The graph grid covers every batch the scheduler can form: up to the token budget (the
    # largest auto may pick), or one sequence of the model's maximum length, which leaves alone.
    budget_bound = config.max_batch_tokens if config.max_batch_tokens != AUTO else LADDER_MAX
    engine.set_graph_grid(
        max(budget_bound, engine.max_positions) if config.max_graph_tokens == AUTO else config.max_graph_tokens,
        config.max_batch_sequences if config.max_graph_seqs == AUTO else config.max_graph_seqs)
    on_cpu = engine.device.type == "cpu"
    max_batch_tokens = config.max_batch_tokens
    if max_batch_tokens == AUTO or (on_cpu and config.max_cpu_step_ms):
        with timing_alone():  # not against another encoder's ladder on this host
            if max_batch_tokens == AUTO:
                max_batch_tokens = auto_batch_tokens(engine)
            if on_cpu and config.max_cpu_step_ms:
                max_batch_tokens = step_bounded_tokens(engine, max_batch_tokens, config.max_cpu_step_ms / 1000)
    if engine.graphs is not None and not engine.graphs.buckets.covers(
            max(max_batch_tokens, engine.max_positions), config.max_batch_sequences):
        log.warning("the CUDA graph grid (max_graph_tokens=%d, max_graph_seqs=%d) does not cover every batch "
                    "(max_batch_tokens=%d, max_batch_sequences=%d): larger batches run eagerly",
                    engine.graphs.buckets.max_tokens, engine.graphs.buckets.max_seqs, max_batch_tokens,
                    config.max_batch_sequences)
    batch_class_tokens = batch_class_budget(config.max_batch_class_tokens, max_batch_tokens, on_cpu)
    backfill_tokens = backfill_budget(config.max_backfill_tokens, batch_class_tokens, on_cpu)
    if on_cpu and not config.num_threads:  # auto: threads by each step's work
        engine = StepThreads(engine, torch.get_num_threads(), flops_per_token(engine.model), torch.set_num_threads)
    return engine, (max_batch_tokens, batch_class_tokens, backfill_tokens)
