"""Requests that wait for the encoder share its calls (gateway/engine/backend.py + rose_client/aio.py):
over HTTP, against a fake replica that holds its calls until the test opens them."""
import asyncio

import numpy as np

from rose_client.aio_stream import ReplicaError
from rose_client.scheduling import RetryPolicy
from rose_wire import INVALID_ARG, WireError, encode
from testing.gateway_app import gateway_client

ONE_TRY = RetryPolicy(max_attempts=1, base_cooldown_s=0.01, max_cooldown_s=0.02, max_unavailable_s=1.0)
MODEL = "all-MiniLM-L6-v2"
BAD_ID = 13  # the fake encoder refuses a call holding this token id, as an encoder refuses a bad input


class HeldReplica:
    """Embeds a sequence as [sum of its ids, its length]; scores a document by its length.
    Holds each call until `opened` is set."""

    def __init__(self):
        self.calls = []
        self.arrived = asyncio.Queue()
        self.opened = asyncio.Event()

    def slot(self, url):
        replica = self

        class Slot:
            async def call(self, call):
                replica.calls.append(call)
                replica.arrived.put_nowait(call)
                await replica.opened.wait()
                if call.model == "rerank":
                    return np.array([len(d) for d in call.inputs["DOCUMENTS"]], dtype=np.float32)
                ids, lens = call.inputs["INPUT_IDS"], call.inputs["SEQ_LENS"]
                if (ids == BAD_ID).any():
                    raise ReplicaError(url, encode(WireError(INVALID_ARG, "INPUT_IDS holds a bad id", "INPUT_IDS")))
                return np.stack([[p.sum(), len(p)] for p in np.split(ids, np.cumsum(lens)[:-1])]).astype(np.float32)

            async def is_ready(self):
                return True

            async def close(self):
                pass

        return Slot()


def run(scenario):
    """`scenario(client, replica, dispatcher)` against the app, one slot on one fake replica."""
    replica = HeldReplica()

    async def main():
        async with gateway_client(replica.slot, workers=1, retry=ONE_TRY, reranker=True) as (client, app):
            return await asyncio.wait_for(scenario(client, replica, app.state.gateway.backend.dispatcher), 60)

    return asyncio.run(main()), replica


async def queued(dispatcher, count):
    """Until `count` chunks wait in the dispatcher's queue (the requests are parsed and admitted)."""
    while len(dispatcher.tasks) < count:
        await asyncio.sleep(0.005)


def embed(client, ids):
    return asyncio.ensure_future(client.post("/v1/embeddings", json={"model": MODEL, "input": ids}))


def test_waiting_requests_share_a_call_and_a_bad_one_fails_alone():
    inputs = {"good": [[1, 2, 3], [4, 5]], "bad": [[6, BAD_ID]], "other": [[7, 8, 9, 10]]}

    async def scenario(client, replica, dispatcher):
        first = embed(client, [[11, 12]])
        await replica.arrived.get()  # the free slot took it at once
        waiting = {name: embed(client, ids) for name, ids in inputs.items()}
        await queued(dispatcher, 3)
        replica.opened.set()
        await first
        return {name: await response for name, response in waiting.items()}

    responses, replica = run(scenario)
    shared = replica.calls[1]
    assert shared.inputs["SEQ_LENS"].tolist() == [3, 2, 2, 4]  # the three requests in one call
    assert len(replica.calls) == 5  # refused as a whole, then each request alone
    assert responses["bad"].status_code == 400 and responses["bad"].json()["error"]["param"] == "input"
    for name in ("good", "other"):
        assert responses[name].status_code == 200, responses[name].text
        rows = [d["embedding"] for d in responses[name].json()["data"]]
        assert rows == [[float(sum(ids)), float(len(ids))] for ids in inputs[name]]


def test_rerank_requests_with_the_same_query_share_a_call():
    async def scenario(client, replica, dispatcher):
        def rerank(query, documents):
            return asyncio.ensure_future(client.post("/v1/rerank", json={"query": query, "documents": documents}))

        first = rerank("q", ["held"])
        await replica.arrived.get()
        same = [rerank("q", ["a", "bbb"]), rerank("q", ["cc"])]
        other = rerank("another query", ["dddd"])
        await queued(dispatcher, 3)
        replica.opened.set()
        answered = [await r for r in (first, *same, other)]
        return answered, (await client.get("/metrics")).text

    (responses, metrics), replica = run(scenario)
    assert "gateway_encoder_calls 3.0" in metrics and "gateway_coalesced_chunks 2.0" in metrics
    assert [c.inputs["DOCUMENTS"].tolist() for c in replica.calls] == [[b"held"], [b"a", b"bbb", b"cc"], [b"dddd"]]
    assert [c.inputs["QUERY"].tolist() for c in replica.calls] == [[b"q"], [b"q"], [b"another query"]]
    scores = [{r["index"]: r["relevance_score"] for r in response.json()["results"]} for response in responses]
    assert scores == [{0: 4.0}, {0: 1.0, 1: 3.0}, {0: 2.0}, {0: 4.0}]
