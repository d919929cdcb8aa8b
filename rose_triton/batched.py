"""Requests a unary front answers together: `embed_batched` (those Triton's dynamic batcher hands
over in one `execute`) and `embed` / `score` (those waiting in an instance's answer loop,
rose_triton/front.py AnswerLoop).

Their inputs are tokenized in one call. Requests asking for the same outputs with the same
parameters form a group (up to MAX_GROUP_TOKENS), and each group is one call to the encoder. The
rows that come back are split among the group's requests in order. Whatever fails for one request
(its parameters, its texts) is that request's error alone; a failed encoder call is the error of
every request in its group, except an input error of a group of several: then each member is
called alone, so each gets its own verdict. A group carries its members' priority class (the one
each would get alone: engine_lib.options default_priority), so small requests stay interactive.
A request whose outputs are not one row per text (sparse, multi-vector, INT8_RANGES) or that
carries a trace is called alone.
"""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Callable, Hashable, Sequence

import numpy as np

from engine_lib.errors import InputError
from engine_lib.options import PRIORITY_PARAMETER, default_priority, parse_embedding_types
from rose_wire import INPUT_IDS, OUTPUT_OF_TYPE, SCORES, SEQ_LENS, TEXT_WINDOWS, TOKEN_TYPE_IDS

from .errors import triton_error
from .front import encoder_answer, exec_decoupled

# The outputs with one row per text: the only ones a request's rows can be cut out of a group's.
ROW_TYPES = ("float", "int8", "uint8", "binary", "ubinary")
ROW_OUTPUTS = tuple(OUTPUT_OF_TYPE[t] for t in ROW_TYPES)
SHAREABLE_OUTPUTS = frozenset(ROW_OUTPUTS + (SCORES,))  # SCORES: one row per document
# Grouping pays for short requests; a longer one is its own call, and a group stays far inside the
# encoder's bound on one request (max_queued_tokens, 1 Mi tokens by default).
MAX_GROUP_TOKENS = 16384


def check_row_types(parameters: dict) -> None:
    """InputError if the parameter `embedding_types` names a type that is not one row per text."""
    others = [t for t in parse_embedding_types(parameters.get("embedding_types")) if t not in ROW_TYPES]
    if others:
        raise InputError(f"embedding_types {others} are not served by this batched front, which answers one row "
                         f"per text ({', '.join(ROW_TYPES)}); ask the unary front or the ensemble for them",
                         "embedding_types")


@dataclass
class Group:
    """Requests (by their index in the execute call) that go to the encoder as one call."""
    parameters: dict
    outputs: tuple[str, ...]
    members: list[int] = field(default_factory=list)
    tokens: int = 0


@dataclass(frozen=True)
class Ask:
    """One request as its front read it. `shareable`: it may share an encoder call (its outputs are
    rows, SHAREABLE_OUTPUTS, and no trace goes with it)."""
    raw: str  # the parameters as sent: requests share a call only with the same text
    parameters: dict
    wanted: tuple[str, ...]
    arrays: dict  # input name -> numpy array (None: not sent)
    shareable: bool = True


def group_requests(keyed: Sequence[tuple[int, Hashable, dict, Sequence[str], int, bool]],
                   max_tokens: int = MAX_GROUP_TOKENS) -> list[Group]:
    """(index, sharing key, parsed parameters, wanted outputs, tokens, shareable) per request ->
    groups, in order of their first member. Shareable requests with the same key (e.g. the raw
    parameters) and outputs share a group while its tokens stay within `max_tokens`; the rest go alone."""
    groups: list[Group] = []
    open_groups: dict[tuple[Hashable, tuple[str, ...]], Group] = {}
    for index, sharing, parameters, outputs, tokens, shareable in keyed:
        key = (sharing, tuple(outputs))
        group = open_groups.get(key) if shareable else None
        if group is None or group.tokens + tokens > max_tokens:
            group = Group(parameters, tuple(outputs))
            groups.append(group)
            if shareable:
                open_groups[key] = group
        group.members.append(index)
        group.tokens += tokens
    return groups


def merge_tokens(tokenized: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The tokenizer's wire tensors of several requests as one request's: ids and lengths concatenated;
    TEXT_WINDOWS (windows per text) kept when any request has them, one window a text for the rest."""
    merged = {INPUT_IDS: np.concatenate([t[INPUT_IDS] for t in tokenized]),
              SEQ_LENS: np.concatenate([t[SEQ_LENS] for t in tokenized])}
    if TOKEN_TYPE_IDS in tokenized[0]:  # per token, or empty (the model's single segment) for all
        merged[TOKEN_TYPE_IDS] = np.concatenate([t[TOKEN_TYPE_IDS] for t in tokenized])
        if merged[TOKEN_TYPE_IDS].size not in (0, merged[INPUT_IDS].size):
            raise RuntimeError("some requests of a group have TOKEN_TYPE_IDS and some do not")
    if TEXT_WINDOWS in tokenized[0]:
        if any(t[TEXT_WINDOWS].size for t in tokenized):
            merged[TEXT_WINDOWS] = np.concatenate([
                t[TEXT_WINDOWS] if t[TEXT_WINDOWS].size else np.ones(len(t[SEQ_LENS]), dtype=np.int64)
                for t in tokenized])
        else:
            merged[TEXT_WINDOWS] = tokenized[0][TEXT_WINDOWS]
    return merged


def texts_of(tokens: dict[str, np.ndarray]) -> int:
    """How many texts (rows of the answer) one request's wire tensors carry."""
    windows = tokens.get(TEXT_WINDOWS)
    return int(windows.size) if windows is not None and windows.size else int(tokens[SEQ_LENS].size)


def split_rows(outputs: dict[str, np.ndarray], counts: Sequence[int]) -> list[dict[str, np.ndarray]]:
    """A group's answer ({name: rows}) -> each request's, `counts[i]` rows in order; the rows must add up."""
    total = sum(counts)
    for name, rows in outputs.items():
        if len(rows) != total:
            raise RuntimeError(f"the encoder returned {len(rows)} rows of {name} for {total} texts")
    stops = np.cumsum(counts)
    return [{name: rows[stop - count:stop] for name, rows in outputs.items()} for count, stop in zip(counts, stops)]


def answer_together(requests: Sequence, read: Callable[[object], Ask], front, pb_utils) -> list[asyncio.Future]:
    """Each of `requests`' response, a future of the running loop (call it there; it never raises).
    `read(request)` -> Ask (an InputError or ValueError is that request's error); `front`: the model,
    with `tokenize`, `config` (encoder_model, bls_timeout_s) and `traced` (rose_triton/front.py)."""
    loop = asyncio.get_running_loop()
    answers = [loop.create_future() for _ in requests]

    def fail(indices, exc):
        _answer_error(answers, indices, exc, pb_utils)

    asked: dict[int, Ask] = {}
    for i, request in enumerate(requests):
        try:
            asked[i] = read(request)
        except InputError as exc:
            fail([i], exc)
        except ValueError as exc:
            fail([i], InputError(f"parameters: {exc}"))
        except Exception as exc:  # every request gets an answer
            fail([i], exc)
    try:
        results = front.tokenize.many([(a.arrays, a.parameters) for a in asked.values()])
        if len(results) != len(asked):
            raise RuntimeError(f"the tokenize step gave {len(results)} results for {len(asked)} requests")
        tokenized = dict(zip(asked, results))
    except Exception as exc:  # a fault of the step itself (input errors come back per request)
        fail(asked, RuntimeError(f"tokenizing failed: {exc!r}"))
        return answers
    keyed = []
    for i, ask in asked.items():
        if isinstance(tokenized[i], Exception):
            fail([i], tokenized[i])
            continue
        tokens = tokenized[i]
        # The encoder classes a request without priority_class by its size: a group gets its members'
        # class explicitly, so small requests stay interactive however many share a call.
        priority = ask.parameters.get(PRIORITY_PARAMETER) or default_priority(len(tokens[SEQ_LENS]),
                                                                                 int(tokens[INPUT_IDS].size))
        keyed.append((i, (ask.raw, priority), {**ask.parameters, PRIORITY_PARAMETER: priority}, ask.wanted,
                      int(tokens[INPUT_IDS].size), ask.shareable))
    for group in group_requests(keyed):
        loop.create_task(_call_encoder(group, requests, tokenized, answers, front, pb_utils))
    return answers


async def _call_encoder(group: Group, requests, tokenized, answers, front, pb_utils) -> None:
    """One encoder call for `group`; sets each member's answer (an input error of several: each alone)."""
    members = group.members
    try:
        first = requests[members[0]]
        encoder = front.config.encoder_model
        inputs = tokenized[members[0]] if len(members) == 1 else merge_tokens([tokenized[i] for i in members])
        bls = pb_utils.InferenceRequest(
            model_name=encoder, inputs=[pb_utils.Tensor(n, a) for n, a in inputs.items()],
            requested_output_names=list(group.outputs), parameters=group.parameters,
            **({"trace": first.trace()} if front.traced else {}))  # a traced request goes alone
        responses = await exec_decoupled(bls, encoder, front.config.bls_timeout_s, first.is_cancelled)
        tensors, error = encoder_answer(responses, group.outputs, encoder, pb_utils)
        if error is not None:
            if len(members) > 1 and error.code() == pb_utils.TritonError.INVALID_ARG:
                await asyncio.gather(*(_call_encoder(Group(group.parameters, group.outputs, [i]), requests,
                                                     tokenized, answers, front, pb_utils) for i in members))
                return
            for i in members:
                answers[i].set_result(pb_utils.InferenceResponse(error=error))
            return
        if len(members) == 1:
            answers[members[0]].set_result(pb_utils.InferenceResponse(output_tensors=tensors))
            return
        rows = {name: tensor.as_numpy() for name, tensor in zip(group.outputs, tensors)}
        for i, own in zip(members, split_rows(rows, [texts_of(tokenized[i]) for i in members])):
            answers[i].set_result(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(n, a) for n, a in own.items()]))
    except Exception as exc:  # every request gets an answer
        _answer_error(answers, members, exc, pb_utils)


def _answer_error(answers, indices, exc, pb_utils) -> None:
    """`exc` as the response of each of `indices` not answered yet."""
    for i in indices:
        if not answers[i].done():
            answers[i].set_result(pb_utils.InferenceResponse(error=triton_error(pb_utils, exc)))


def read_parameters(request) -> tuple[str, dict]:
    """A request's parameters as sent and parsed."""
    raw = request.parameters() or "{}"
    return raw, json.loads(raw)
