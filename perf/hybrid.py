"""Hybrid retrieval numbers (docs/benchmarks.md), one server, one run:
1. BGE-M3's three outputs (dense, sparse, multi-vector) in one /v2/embed call against three separate
   calls and against dense alone: texts/s (the modes' requests interleaved, round by round) and bytes
   per text on the wire (the Triton gRPC output tensors, the gateway's JSON). Timed on a BGE-M3-layout
   folder built here: all-MiniLM-L6-v2's body (6 x 384) with random-weight sparse_linear.pt and
   colbert_linear.pt (the real XLM-R large body is far too slow on 2 cores; only timing and bytes, never
   quality, come from it).
2. recall@10 on the perf corpus's retrieval set (perf/data/corpus.txt: a paragraph's sentence is the
   query of the rest of its paragraph) for every folder given with trained weights: dense (the default
   model), sparse (`--splade-dir`), dense+sparse (reciprocal rank fusion, k = 60) and MaxSim (summed, as
   PyLate) reranking of the dense top 100 (`--colbert-dir`, a ColBERT or BGE-M3 folder).
    python -m perf.hybrid [--splade-dir DIR [--splade-name NAME]] [--colbert-dir DIR] [--rounds 3] [--requests 8]
`--splade-dir` also takes a folder of a bare BertForMaskedLM SPLADE checkpoint (config.json,
model.safetensors, tokenizer files): the sentence-transformers modules are added to a copy."""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import torch
import tritonclient.grpc as grpcclient
from safetensors.torch import load_file, save_file

from rose_triton.server import TritonServer
from rose_wire import EMBEDDER, TEXT, served_models

from . import RESULTS
from .machine import describe, machine_line, slug
from .runner import model_info
from .texts import CORPUS, TextMaker

DEFAULT, M3, SPLADE, COLBERT = "all-MiniLM-L6-v2", "m3-layout", "splade", "colbert"
MODES = {"one call: dense+sparse+multivector": [["float", "sparse", "multivector"]],
         "three calls: dense, sparse, multivector": [["float"], ["sparse"], ["multivector"]],
         "dense alone": [["float"]]}
TEXTS_PER_REQUEST, TOKENS_PER_TEXT = 16, 128


def m3_layout_folder(root: Path) -> Path:
    source, folder = model_info(None)["dir"], root / M3
    shutil.copytree(source, folder)
    hidden = json.loads((folder / "config.json").read_text())["hidden_size"]
    torch.manual_seed(0)
    torch.save(torch.nn.Linear(hidden, 1).state_dict(), folder / "sparse_linear.pt")
    torch.save(torch.nn.Linear(hidden, hidden).state_dict(), folder / "colbert_linear.pt")
    return folder


def splade_folder(source: str, root: Path) -> Path:
    """A SparseEncoder folder from `source` (as is when it has modules.json); old BERT checkpoints'
    LayerNorm gamma/beta names become weight/bias (as transformers renames them on load)."""
    if os.path.isfile(os.path.join(source, "modules.json")):
        return Path(source)
    folder = root / SPLADE
    shutil.copytree(source, folder)
    weights = load_file(str(folder / "model.safetensors"))
    save_file({re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", k)): v
               for k, v in weights.items()}, str(folder / "model.safetensors"))
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.sparse_encoder.modules.MLMTransformer"},
        {"idx": 1, "name": "1", "path": "1_SpladePooling",
         "type": "sentence_transformers.sparse_encoder.modules.SpladePooling"}]))
    (folder / "1_SpladePooling").mkdir()
    (folder / "1_SpladePooling" / "config.json").write_text(json.dumps(
        {"pooling_strategy": "max", "activation_function": "relu", "word_embedding_dimension": vocab}))
    return folder


def post(gateway: str, body: dict) -> bytes:
    request = urllib.request.Request(f"{gateway}/v2/embed", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        return response.read()


def grpc_bytes(server: TritonServer, texts: list[str], types: list[str]) -> int:
    """Bytes of the output tensors the unary front answers for `types`."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        text = grpcclient.InferInput(TEXT, [len(texts)], "BYTES")
        text.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=object))
        result = client.infer(served_models(M3, EMBEDDER).front, [text], parameters={"embedding_types": ",".join(types)})
        return sum(result.as_numpy(o.name).nbytes for o in result.get_response().outputs)
    finally:
        client.close()


def one_call_vs_three(server: TritonServer, rounds: int, requests: int) -> dict:
    maker, rng = TextMaker(os.path.join(model_info(None)["dir"], "tokenizer.json"), 256), random.Random(7)
    batches = [[maker.text(TOKENS_PER_TEXT, rng) for _ in range(TEXTS_PER_REQUEST)] for _ in range(requests)]
    seconds = dict.fromkeys(MODES, 0.0)
    for calls in MODES.values():  # warm-up
        for types in calls:
            post(server.gateway_url, {"model": M3, "texts": batches[0], "embedding_types": types})
    for _ in range(rounds):
        for mode, calls in MODES.items():
            started = time.perf_counter()
            for texts in batches:
                for types in calls:
                    post(server.gateway_url, {"model": M3, "texts": texts, "embedding_types": types})
            seconds[mode] += time.perf_counter() - started
    out = {}
    for mode, calls in MODES.items():
        texts = batches[0]
        out[mode] = {"texts_per_s": rounds * requests * TEXTS_PER_REQUEST / seconds[mode],
                     "grpc_bytes_per_text": sum(grpc_bytes(server, texts, t) for t in calls) / len(texts),
                     "json_bytes_per_text": sum(len(post(server.gateway_url, {"model": M3, "texts": texts,
                                                                              "embedding_types": t}))
                                                for t in calls) / len(texts)}
    return out


def retrieval_set(min_sentences: int = 3) -> tuple[list[str], list[str], list[int]]:
    """(documents, queries, source document of each query): the compact types' recall@10 set."""
    rng = random.Random(19)
    documents, queries, sources = [], [], []
    with open(CORPUS) as f:
        for line in f:
            sentences = [s for s in re.split(r"(?<=[.!?])\s+", line.strip()) if len(s.split()) >= 5]
            if len(sentences) < min_sentences:
                continue
            pick = rng.randrange(len(sentences))
            queries.append(sentences[pick])
            documents.append(" ".join(s for i, s in enumerate(sentences) if i != pick))
            sources.append(len(documents) - 1)
    return documents, queries, sources


def embed(server: TritonServer, model: str, texts: list[str], kind: str, input_type: str) -> list:
    out = []
    for i in range(0, len(texts), 32):
        body = {"model": model, "texts": texts[i:i + 32], "embedding_types": [kind], "input_type": input_type}
        out += json.loads(post(server.gateway_url, body))["embeddings"][kind]
    return out


def sparse_scores(queries: list[dict], documents: list[dict]) -> np.ndarray:
    scores = np.zeros((len(queries), len(documents)))
    for j, d in enumerate(documents):
        weights = dict(zip(d["indices"], d["values"]))
        for i, q in enumerate(queries):
            scores[i, j] = sum(v * weights.get(k, 0.0) for k, v in zip(q["indices"], q["values"]))
    return scores


def ranks(scores: np.ndarray) -> np.ndarray:
    order = np.argsort(-scores, axis=1, kind="stable")
    out = np.empty_like(order)
    np.put_along_axis(out, order, np.arange(scores.shape[1])[None, :], axis=1)
    return out


def recall(server: TritonServer, models: dict) -> dict:
    documents, queries, sources = retrieval_set()
    truth = np.array(sources)[:, None]
    at10 = lambda s: float((np.argsort(-s, axis=1, kind="stable")[:, :10] == truth).any(axis=1).mean())
    q = np.array(embed(server, DEFAULT, queries, "float", "search_query"))
    dense = q @ np.array(embed(server, DEFAULT, documents, "float", "search_document")).T
    out = {"documents": len(documents), "queries": len(queries), "dense (all-MiniLM-L6-v2)": at10(dense)}
    if SPLADE in models:
        sparse = sparse_scores(embed(server, SPLADE, queries, "sparse", "search_query"),
                               embed(server, SPLADE, documents, "sparse", "search_document"))
        out[f"sparse ({models[SPLADE]})"] = at10(sparse)
        out["dense+sparse (reciprocal rank fusion)"] = at10(1 / (60 + ranks(dense)) + 1 / (60 + ranks(sparse)))
    if COLBERT in models:
        qv = [np.array(v) for v in embed(server, COLBERT, queries, "multivector", "search_query")]
        dv = [np.array(v) for v in embed(server, COLBERT, documents, "multivector", "search_document")]
        reranked = np.full_like(dense, -np.inf)
        for i, top in enumerate(np.argsort(-dense, axis=1, kind="stable")[:, :100]):
            reranked[i, top] = [(qv[i] @ dv[j].T).max(1).sum() for j in top]
        out[f"MaxSim rerank of dense top 100 ({models[COLBERT]})"] = at10(reranked)
    return out


def markdown(results: dict) -> str:
    lines = ["# Hybrid retrieval: one call against three, recall@10", "", machine_line(results["machine"]), "",
             f"Timing model: {results['timing_model']}. Requests of {TEXTS_PER_REQUEST} texts x {TOKENS_PER_TEXT} "
             f"tokens, /v2/embed, one client, {results['rounds']} interleaved rounds.", "",
             "| mode | texts/s | x dense alone | gRPC bytes/text | JSON bytes/text |", "|---|---|---|---|---|"]
    dense = results["modes"]["dense alone"]["texts_per_s"]
    for mode, r in results["modes"].items():
        lines.append(f"| {mode} | {r['texts_per_s']:.1f} | {r['texts_per_s'] / dense:.2f} | "
                     f"{r['grpc_bytes_per_text']:.0f} | {r['json_bytes_per_text']:.0f} |")
    rec = results["recall"]
    lines += ["", f"recall@10, {rec['queries']} queries over {rec['documents']} documents:", "",
              "| scoring | recall@10 |", "|---|---|"]
    lines += [f"| {k} | {v:.3f} |" for k, v in rec.items() if k not in ("documents", "queries")]
    return "\n".join(lines + ["", *results["not_measured"]]) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m perf.hybrid", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--splade-dir", help="a SPLADE folder with trained weights")
    parser.add_argument("--colbert-dir", help="a ColBERT or BGE-M3 folder with trained weights")
    parser.add_argument("--splade-name", help="the SPLADE model's name in the report (default: its folder's)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=8, help="requests of each mode per round")
    parser.add_argument("--out", default=str(RESULTS / slug(describe())))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="rose-hybrid.") as tmp:
        root = Path(tmp)
        served = {M3: str(m3_layout_folder(root))}
        named = {}
        if args.splade_dir:
            served[SPLADE], named[SPLADE] = str(splade_folder(args.splade_dir, root)), args.splade_name or Path(args.splade_dir).name
        if args.colbert_dir:
            served[COLBERT], named[COLBERT] = args.colbert_dir, Path(args.colbert_dir).name
        (root / "models.json").write_text(json.dumps({"embedders": {k: {"model_dir": v} for k, v in served.items()}}))
        server = TritonServer(root / "server.log", gateway=True, serve_args=["--models-file", str(root / "models.json")])
        try:
            results = {"machine": describe(), "rounds": args.rounds,
                       "timing_model": "BGE-M3 layout on all-MiniLM-L6-v2's body (6 layers x 384, multi-vectors of "
                                       "384 floats), random-weight sparse_linear/colbert_linear",
                       "modes": one_call_vs_three(server, args.rounds, args.requests),
                       "recall": recall(server, named),
                       "not_measured": [f"not measured: {what} (no folder with trained weights given)"
                                        for what, key in (("sparse and dense+sparse", SPLADE),
                                                          ("MaxSim rerank", COLBERT)) if key not in named]}
        finally:
            server.stop()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "hybrid.json").write_text(json.dumps(results, indent=1))
    (out / "hybrid.md").write_text(markdown(results))
    print(markdown(results))


if __name__ == "__main__":
    main()
