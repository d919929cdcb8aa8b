"""Bulk embedding from the command line, resumable.

  python -m rose_client.bulk docs.jsonl vectors.npy --url HOST:8001 --url HOST2:8001

Reads a text file (one text per line) or JSONL, writes .npy ([N, D] float32,
row i = input line i) or .parquet (columns id, embedding). Interrupted? Run the
same command again: finished chunks are kept (see rose_client/store.py). Every
replica is probed first: they must serve one model, the model the job started
with (identity.py); OUT.lock keeps a second run off the same output.
"""
from __future__ import annotations

import argparse
import os
import sys

from rose_wire import ENSEMBLE

from .aio import JobFailed
from .chunking import plan_fingerprint
from .client import EmbeddingClient
from .identity import ModelMismatch
from .inputs import read_input
from .scheduling import RetryPolicy
from .store import OutputLock, OutputLocked, ResumableOutput, ResumeMismatch
from .tokens import ByteEstimator, TokenizerCounter


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m rose_client.bulk", description=__doc__.split("\n\n")[0])
    p.add_argument("input", help="text file (one text per line) or .jsonl")
    p.add_argument("output", help="OUT.npy or OUT.parquet")
    p.add_argument("--url", action="append", required=True,
                   help="replica gRPC address host:port; repeat for more; dns:///name:port expands to every address")
    p.add_argument("--format", choices=("auto", "text", "jsonl"), default="auto")
    p.add_argument("--text-field", default="text")
    p.add_argument("--id-field", default="id")
    p.add_argument("--model", default=ENSEMBLE,
                   help="the Triton model to embed with: ensemble (the default model), or the name of a model served "
                        "by name (its ensemble)")
    p.add_argument("--input-type", choices=("document", "query"), default="document")
    p.add_argument("--dimensions", type=int, default=0, help="keep the first N dimensions (0 = all)")
    p.add_argument("--no-normalize", action="store_true")
    p.add_argument("--no-truncate", action="store_true", help="fail on texts longer than the model's maximum")
    p.add_argument("--priority", choices=("batch", "interactive"), default="batch",
                   help="the encoders' scheduling class: batch (default) fills what interactive requests leave")
    p.add_argument("--tokenizer", help="tokenizer.json (or model folder) to size chunks exactly; default: byte estimate")
    p.add_argument("--max-chunk-tokens", type=int, default=4096)
    p.add_argument("--max-chunk-texts", type=int, default=256)
    p.add_argument("--max-text-tokens", type=int, default=None, help="cap per text when sizing chunks")
    p.add_argument("--max-inflight", type=int, default=4, help="chunks in flight per replica")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds before a chunk is retried elsewhere")
    p.add_argument("--max-attempts", type=int, default=4)
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output file")
    return p.parse_args(argv)


def run(args: argparse.Namespace) -> int:
    with OutputLock(args.output) as lock:
        if lock.stale_holder:
            print(f"note: took over {lock.path} from a run that is gone ({lock.stale_holder})", file=sys.stderr)
        return _run_locked(args)


def _run_locked(args: argparse.Namespace) -> int:
    if os.path.exists(args.output) and not args.overwrite:
        print(f"{args.output} exists; pass --overwrite to replace it", file=sys.stderr)
        return 2
    job_input = read_input(args.input, args.format, args.text_field, args.id_field)
    if not job_input.texts:
        print(f"{args.input}: no texts", file=sys.stderr)
        return 2
    client = EmbeddingClient(
        args.url, model=args.model, max_inflight_per_replica=args.max_inflight,
        max_chunk_tokens=args.max_chunk_tokens, max_chunk_texts=args.max_chunk_texts,
        max_text_tokens=args.max_text_tokens, request_timeout=args.timeout,
        token_counter=TokenizerCounter(args.tokenizer) if args.tokenizer else ByteEstimator(),
        retry=RetryPolicy(max_attempts=args.max_attempts))
    parameters = {"input_type": args.input_type, "dimensions": args.dimensions,
                  "normalize": not args.no_normalize, "truncate": not args.no_truncate}
    chunks = client.plan(job_input.texts)
    try:
        identity, silent = client.model_identity(parameters)
    except JobFailed as exc:
        print(f"job failed: {exc}", file=sys.stderr)
        return 1
    for url, why in silent.items():
        print(f"warning: {url} did not answer the model probe ({why}); not used", file=sys.stderr)
    output = ResumableOutput(args.output, {
        "input_sha256": job_input.sha256, "num_texts": len(job_input.texts), "model": identity.to_json(),
        "chunk_plan": plan_fingerprint(chunks), "parameters": parameters})
    try:
        done = output.open()
        todo = [c for c in chunks if c.index not in done]
        texts_done = sum(c.num_texts for c in chunks if c.index in done)
        if done:
            print(f"resuming: {len(done)} of {len(chunks)} chunks already done", file=sys.stderr)
        with _progress_bar(len(job_input.texts), texts_done, args.no_progress) as bar:
            # The class is not part of the resume manifest: it changes no row.
            client.run(job_input.texts, todo, output.write, {**parameters, "priority_class": args.priority},
                       on_progress=lambda n, total: bar.update(n - bar.n), texts_done=texts_done)
        output.finish(job_input.ids)
    except JobFailed as exc:
        print(f"job failed: {exc}\nfinished chunks are kept; run the same command to resume", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; finished chunks are kept; run the same command to resume", file=sys.stderr)
        return 130
    finally:
        output.close()
    print(f"wrote {args.output}: {len(job_input.texts)} rows in {len(chunks)} chunks over "
          f"{len(client.urls)} replica(s)", file=sys.stderr)
    return 0


def _progress_bar(total: int, initial: int, disable: bool):
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit="text", disable=disable, smoothing=0.1)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return run(args)
    except (ModelMismatch, OutputLocked, ResumeMismatch) as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
