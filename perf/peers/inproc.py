"""In-process worker, run with the peer's own venv python: `python -m perf.peers.inproc st|ort|rose MODEL_DIR`;
length-prefixed pickles on stdin/stdout: ("embed", requests), ("latency", ...), ("throughput", ...), ("info",)."""
from __future__ import annotations

import argparse
import os
import pickle
import struct
import sys
import threading

import numpy as np

from perf.machine import versions
from perf.measure import latency_loop, threaded_loop


def sentence_transformers_encoder(model_dir: str, max_length: int):
    from sentence_transformers import SentenceTransformer  # only in this backend's venv

    model = SentenceTransformer(model_dir)  # CUDA where there is one
    model.max_seq_length = max_length

    def encode(texts):
        return model.encode(list(texts), batch_size=len(texts), normalize_embeddings=True)

    return encode, ["sentence-transformers", "torch", "transformers", "tokenizers"]


def onnxruntime_encoder(onnx_dir: str, max_length: int):
    import onnxruntime as ort  # only in this backend's venv
    from tokenizers import Tokenizer  # with onnxruntime, in that venv

    tokenizer = Tokenizer.from_file(os.path.join(onnx_dir, "tokenizer.json"))
    tokenizer.enable_truncation(max_length)
    tokenizer.enable_padding()
    session = ort.InferenceSession(os.path.join(onnx_dir, "model.onnx"), providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}

    def encode(texts):
        encodings = tokenizer.encode_batch(list(texts))
        ids = np.array([e.ids for e in encodings], dtype=np.int64)       # [batch, max_len] padded
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in names:
            feeds["token_type_ids"] = np.zeros_like(ids)
        hidden = session.run(None, feeds)[0]                               # [batch, max_len, hidden]
        pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
        return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)

    return encode, ["onnxruntime", "optimum-onnx", "tokenizers"]


def rose_engine_encoder(model_dir: str, max_length: int):
    """Our engine with no server: the tokenizer model's encode and one `ModelRunner.step` per request
    (steps one at a time, as the encoder runs them), what the ONNX Runtime peer does with its session."""
    from engine_lib.config import TokenizerConfig  # ours (torch): only in this repository's venv
    from engine_lib.contract import PackedBatch  # as above
    from engine_lib.options import RequestOptions  # as above
    from engine_lib.runner.model_runner import ModelRunner  # as above
    from engine_lib.tokenization.text import TextTokenizer  # as above

    engine = ModelRunner(model_dir)
    tokenizer = TextTokenizer(model_dir, TokenizerConfig(), max_length=max_length)
    options, one_step = RequestOptions(), threading.Lock()

    def encode(texts):
        tokens = tokenizer.encode(list(texts), options)
        batch = PackedBatch.from_flat(tokens.input_ids, tokens.seq_lens)
        with one_step:
            pooled = engine.step(batch).wait()
        return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)

    return encode, ["torch", "tokenizers"]


BACKENDS = {"st": sentence_transformers_encoder, "ort": onnxruntime_encoder, "rose": rose_engine_encoder}


def serve(encode, package_versions, rx, tx):
    def call(request):
        return encode(request.texts)

    while True:
        header = rx.read(8)
        if len(header) < 8:
            return
        message = pickle.loads(rx.read(struct.unpack("<Q", header)[0]))
        command, args = message[0], message[1:]
        if command == "quit":
            return
        if command == "info":
            reply = {"versions": package_versions}
        elif command == "embed":
            reply = [np.asarray(encode(r.texts), dtype=np.float32) for r in args[0]]
        elif command == "latency":
            reply = latency_loop(call, *args)
        elif command == "throughput":
            reply = threaded_loop(call, *args)
        else:
            reply = RuntimeError(f"unknown command {command!r}")
        data = pickle.dumps(reply)
        tx.write(struct.pack("<Q", len(data)) + data)
        tx.flush()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("backend", choices=sorted(BACKENDS))
    parser.add_argument("model_dir")
    parser.add_argument("--max-length", type=int, default=256)
    args = parser.parse_args()
    encode, packages = BACKENDS[args.backend](args.model_dir, args.max_length)
    rx, tx = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # stray prints must not corrupt the pipe
    serve(encode, versions(packages), rx, tx)


if __name__ == "__main__":
    main()
