"""Tokens/s of the gateway's tokenizer path against `tokenizers` alone, same process, same texts.

  python -m perf.tokenize_bench [--requests 2000] [--batch 1] [--tokens 128] [--concurrency 16]

Rows (each the median of --rounds rounds, interleaved):
- `tokenizers`, one encode_batch: every text in one call (the ceiling: no per-request cost);
- `tokenizers`, per request: one encode_batch per request, one after another;
- gateway, per request on the loop: `GatewayTokenizer.encode_texts` per request (templates,
  limits, EOS rule, arrays: the path small requests took before TokenizeQueue);
- gateway, TokenizeQueue: --concurrency asyncio clients each awaiting `TokenizeQueue.encode`
  for its share of the requests (what concurrent HTTP requests do).
The ratio column is tokens/s over the first row's."""
from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from engine_lib.model_folder import ModelFolder
from engine_lib.options import RequestOptions
from gateway.config import DEFAULT_TOKENIZER_CONFIG
from gateway.tokenizing import GatewayTokenizer, TokenizeQueue

from .texts import TextMaker


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


async def _concurrent(queue: TokenizeQueue, requests: list[list[str]], concurrency: int) -> None:
    options = RequestOptions()

    async def client(share: list[list[str]]) -> None:
        for texts in share:
            await queue.encode(texts, options)

    await asyncio.gather(*(client(requests[i::concurrency]) for i in range(concurrency)))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m perf.tokenize_bench", description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--batch", type=int, default=1, help="texts per request")
    p.add_argument("--tokens", type=int, default=128, help="tokens per text")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)

    gateway = GatewayTokenizer(str(DEFAULT_TOKENIZER_CONFIG))
    plain = gateway.text._full  # the same tokenizer.json, padding and truncation off
    maker = TextMaker(ModelFolder.open(gateway.model_dir).tokenizer_path, gateway.max_length)
    requests = [r.texts for r in maker.requests(args.requests, args.batch, args.tokens)]
    everything = [t for texts in requests for t in texts]
    options = RequestOptions()
    num_tokens = sum(int(gateway.encode_texts(texts, options).seq_lens.sum()) for texts in requests)

    def concurrent() -> None:
        async def run() -> None:
            queue = TokenizeQueue(gateway)
            try:
                await _concurrent(queue, requests, args.concurrency)
            finally:
                queue.close()
        asyncio.run(run())

    paths = {"tokenizers, one encode_batch": lambda: plain.encode_batch(everything),
             "tokenizers, per request": lambda: [plain.encode_batch(texts) for texts in requests],
             "gateway, per request on the loop": lambda: [gateway.encode_texts(texts, options) for texts in requests],
             f"gateway, TokenizeQueue, {args.concurrency} clients": concurrent}
    times: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(args.rounds):
        for name, fn in paths.items():
            times[name].append(timed(fn))
    rates = {name: num_tokens / statistics.median(t) for name, t in times.items()}
    ceiling = next(iter(rates.values()))
    print(f"{args.requests} requests x {args.batch} texts x {args.tokens} tokens ({num_tokens} tokens), "
          f"median of {args.rounds} rounds")
    print("| path | tokens/s | ratio |\n| --- | --- | --- |")
    for name, rate in rates.items():
        print(f"| {name} | {rate:,.0f} | {rate / ceiling:.2f} |")


if __name__ == "__main__":
    main()
