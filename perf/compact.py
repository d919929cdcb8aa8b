"""`python -m perf.compact`: what the compact output types and chunking cost and buy, on the served model.

1. Bytes per row and client-side decode time of each type: gRPC (`embed`, requested outputs:
   the output tensor's bytes; decode = `result.as_numpy`) and the gateway (`/v2/embed` JSON:
   body bytes per row; decode = orjson.loads + numpy.asarray of that type's rows).
2. Retrieval on a set built from perf/data/corpus.txt: documents are its paragraphs (lines of
   3+ sentences), each query is one sentence of its paragraph, taken out of that document.
   recall@10 (the source paragraph in the top 10) of float, int8 (documents de-quantized with
   the served ranges, float queries), binary (Hamming distance between ubinary codes) and
   256-dim Matryoshka (`dimensions=256`), and overlap@10 with float's top 10.
3. Long documents (corpus windows of 2k and 6k tokens): documents/s through the gRPC ensemble
   with `chunking=mean` against the same texts truncated (the default), sequential.
Writes perf/results/<date>-<machine>/compact.{json,md}.
"""
from __future__ import annotations

import argparse
import json
import random
import re
import tempfile
import time
from pathlib import Path

import numpy as np

from . import machine
from .lineup import REPO
from .texts import CORPUS, TextMaker

TYPES = ("float", "int8", "uint8", "binary", "ubinary")
MODEL = "all-MiniLM-L6-v2"


def retrieval_set(min_sentences: int = 3) -> tuple[list[str], list[str], list[int]]:
    """(documents, queries, source document of each query)."""
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


def embed_grpc(url: str, texts: list[str], outputs: list[str], parameters: dict | None = None,
               batch: int = 64) -> dict:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    parts: dict[str, list] = {n: [] for n in outputs}
    try:
        for at in range(0, len(texts), batch):
            chunk = texts[at:at + batch]
            text = grpcclient.InferInput("TEXT", [len(chunk)], "BYTES")
            text.set_data_from_numpy(np.array([t.encode() for t in chunk], dtype=object))
            result = client.infer("embed", [text], outputs=[grpcclient.InferRequestedOutput(n) for n in outputs],
                                  parameters=parameters)
            for n in outputs:
                parts[n].append(result.as_numpy(n))
    finally:
        client.close()
    return {n: np.concatenate(p) for n, p in parts.items()}


def wire_and_decode(server, texts: list[str], repeats: int) -> dict:
    """Per type: bytes per row and decode microseconds per row, gRPC and the gateway."""
    import httpx
    import orjson
    import tritonclient.grpc as grpcclient

    names = {"float": "EMBEDDINGS", "int8": "EMBEDDINGS_INT8", "uint8": "EMBEDDINGS_UINT8",
             "binary": "EMBEDDINGS_BINARY", "ubinary": "EMBEDDINGS_UBINARY"}
    dtypes = {"float": np.float32, "int8": np.int8, "uint8": np.uint8, "binary": np.int8, "ubinary": np.uint8}
    client = grpcclient.InferenceServerClient(server.grpc_url)
    text = grpcclient.InferInput("TEXT", [len(texts)], "BYTES")
    text.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=object))
    rows = {}
    try:
        for kind in (*TYPES, "base64"):
            entry = {}
            if kind in names:
                result = client.infer("embed", [text], outputs=[grpcclient.InferRequestedOutput(names[kind])])
                array = result.as_numpy(names[kind])
                entry["grpc_bytes_per_row"] = array.nbytes / len(texts)
                started = time.perf_counter()
                for _ in range(repeats):
                    result.as_numpy(names[kind])
                entry["grpc_decode_us_per_row"] = (time.perf_counter() - started) / repeats / len(texts) * 1e6
            body = httpx.post(f"{server.gateway_url}/v2/embed", timeout=120,
                              json={"model": MODEL, "texts": texts, "input_type": "search_document",
                                    "embedding_types": [kind]}).content
            entry["gateway_body_bytes_per_row"] = len(body) / len(texts)
            started = time.perf_counter()
            for _ in range(repeats):
                got = orjson.loads(body)["embeddings"][kind]
                if kind == "base64":
                    import base64
                    np.stack([np.frombuffer(base64.b64decode(b), dtype="<f4") for b in got])
                else:
                    np.asarray(got, dtype=dtypes[kind])
            entry["gateway_decode_us_per_row"] = (time.perf_counter() - started) / repeats / len(texts) * 1e6
            rows[kind] = entry
    finally:
        client.close()
    return rows


def top10(scores: np.ndarray) -> np.ndarray:
    return np.argsort(-scores, axis=1, kind="stable")[:, :10]


def retrieval(server) -> dict:
    documents, queries, sources = retrieval_set()
    outs = ["EMBEDDINGS", "EMBEDDINGS_INT8", "EMBEDDINGS_UBINARY"]
    docs = embed_grpc(server.grpc_url, documents, outs, {"input_type": "document"})
    qs = embed_grpc(server.grpc_url, queries, outs, {"input_type": "query"})
    ranges = embed_grpc(server.grpc_url, documents[:1], ["INT8_RANGES"])["INT8_RANGES"]
    cut_docs = embed_grpc(server.grpc_url, documents, ["EMBEDDINGS"], {"dimensions": 256})["EMBEDDINGS"]
    cut_qs = embed_grpc(server.grpc_url, queries, ["EMBEDDINGS"], {"dimensions": 256})["EMBEDDINGS"]
    low, high = ranges
    dequantized = low + (docs["EMBEDDINGS_INT8"].astype(np.float32) + 128) * (high - low) / 255
    bits_q = np.unpackbits(qs["EMBEDDINGS_UBINARY"], axis=1).astype(np.int16)
    bits_d = np.unpackbits(docs["EMBEDDINGS_UBINARY"], axis=1).astype(np.int16)
    hamming = bits_q @ (1 - bits_d).T + (1 - bits_q) @ bits_d.T
    scores = {"float": qs["EMBEDDINGS"] @ docs["EMBEDDINGS"].T, "int8": qs["EMBEDDINGS"] @ dequantized.T,
              "binary": -hamming.astype(np.float32), "256-dim": cut_qs @ cut_docs.T}
    truth = np.array(sources)[:, None]
    float_top = top10(scores["float"])
    out = {"documents": len(documents), "queries": len(queries)}
    for kind, s in scores.items():
        top = top10(s)
        out[kind] = {"recall_at_10": float((top == truth).any(axis=1).mean()),
                     "overlap_at_10_with_float": float(np.mean([len(set(a) & set(b)) / 10
                                                                for a, b in zip(top, float_top)]))}
    return out


def long_documents(server, maker: TextMaker, lengths: list[int], count: int) -> dict:
    import tritonclient.grpc as grpcclient

    rng = random.Random(7)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    out = {}
    try:
        for n in lengths:
            texts = [maker.text(n, rng) for _ in range(count)]
            for mode in ("none", "mean"):
                started = time.perf_counter()
                for t in texts:
                    text = grpcclient.InferInput("TEXT", [1], "BYTES")
                    text.set_data_from_numpy(np.array([t.encode()], dtype=object))
                    client.infer("embed", [text], parameters={"chunking": mode})
                seconds = time.perf_counter() - started
                out[f"{n}_tokens_{'chunked' if mode == 'mean' else 'truncated'}_docs_per_s"] = count / seconds
            out[f"{n}_tokens_chunked_vs_truncated"] = (out[f"{n}_tokens_chunked_docs_per_s"]
                                                       / out[f"{n}_tokens_truncated_docs_per_s"])
    finally:
        client.close()
    return out


def markdown(report: dict) -> str:
    lines = [f"# Compact types and chunking ({report['date']}, {report['machine'].get('cpu', '?')})", "",
             f"Machine busy before/after: {report['busy_before']:.0%} / {report['busy_after']:.0%} "
             "(shared machine: read the timings as rough).", "",
             "| type | gRPC bytes/row | gRPC decode us/row | gateway JSON bytes/row | gateway decode us/row |",
             "|---|---|---|---|---|"]
    for kind, e in report["wire"].items():
        grpc_bytes = f"{e['grpc_bytes_per_row']:.0f}" if "grpc_bytes_per_row" in e else "-"
        grpc_us = f"{e['grpc_decode_us_per_row']:.2f}" if "grpc_decode_us_per_row" in e else "-"
        lines.append(f"| {kind} | {grpc_bytes} | {grpc_us} | {e['gateway_body_bytes_per_row']:.0f} | "
                     f"{e['gateway_decode_us_per_row']:.1f} |")
    r = report["retrieval"]
    lines += ["", f"Retrieval: {r['queries']} queries over {r['documents']} paragraphs of perf/data/corpus.txt "
              "(each query a sentence taken out of its paragraph).", "",
              "| scoring | recall@10 | overlap@10 with float |", "|---|---|---|"]
    for kind in ("float", "int8", "binary", "256-dim"):
        lines.append(f"| {kind} | {r[kind]['recall_at_10']:.3f} | {r[kind]['overlap_at_10_with_float']:.3f} |")
    lines += ["", "| long documents | docs/s |", "|---|---|"]
    lines += [f"| {k} | {v:.3f} |" for k, v in report["long"].items()]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m perf.compact", description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64, help="rows per request for the wire and decode figures")
    parser.add_argument("--repeats", type=int, default=50, help="decode repetitions")
    parser.add_argument("--long", default="2048,6144", help="long-document lengths in tokens")
    parser.add_argument("--long-count", type=int, default=4, help="documents per length")
    parser.add_argument("--out", help="output folder (default: perf/results/<date>-<machine>)")
    args = parser.parse_args(argv)

    from engine_lib.model_folder import ModelFolder
    from rose_triton.server import TritonServer

    desc = machine.describe()
    folder = ModelFolder.open("default")
    maker = TextMaker(folder.tokenizer_path, folder.max_length)
    rng = random.Random(1)
    texts = [maker.text(128, rng) for _ in range(args.rows)]
    work = Path(tempfile.mkdtemp(prefix="perf-compact-"))
    server = TritonServer(work / "server.log", env={"ROSE_CACHE_DIR": str(work / "cache")}, gateway=True,
                          ready_timeout=600)
    try:
        busy = machine.cpu_busy(2.0)
        report = {"wire": wire_and_decode(server, texts, args.repeats), "retrieval": retrieval(server),
                  "long": long_documents(server, maker, [int(n) for n in args.long.split(",")], args.long_count)}
        busy_after = machine.cpu_busy(2.0)
    finally:
        server.stop()
    report.update({"machine": desc, "busy_before": busy, "busy_after": busy_after,
                   "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())})
    out_dir = Path(args.out) if args.out else REPO / "perf" / "results" / machine.slug(desc)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "compact.json").write_text(json.dumps(report, indent=1))
    (out_dir / "compact.md").write_text(markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
