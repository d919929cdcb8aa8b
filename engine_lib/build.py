"""Construction: an Encoder (engine + service) from an EncoderConfig."""
from __future__ import annotations

from .config import EncoderConfig
from .encoder import Encoder
from .serving import EncoderService
from .step_threads import StepThreads, flops_per_token


def build_encoder(config: EncoderConfig) -> Encoder:
    import torch

    from .engine import Engine

    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    engine = Engine(config.model_dir, device=config.device, dtype=config.dtype,
                    attention_backend=config.attention_backend, cuda_graphs=config.cuda_graphs,
                    max_graph_tokens=config.max_graph_tokens, max_graph_seqs=config.max_graph_seqs,
                    task=config.task)
    if engine.device.type == "cpu" and not config.num_threads:  # auto: threads by each step's work
        engine = StepThreads(engine, torch.get_num_threads(), flops_per_token(engine.model), torch.set_num_threads)
    return Encoder(EncoderService(engine, config.max_batch_tokens, config.max_batch_sequences,
                                  config.max_inflight_batches, config.max_queued_tokens,
                                  config.max_queued_requests))
