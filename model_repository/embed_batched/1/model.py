"""Batched unary front: Triton's dynamic batcher hands over several requests (one text per batch row);
the texts are tokenized together and each group with the same options is one BLS call to the encoder
(rose_triton/batched.py). Its tokenizer and encoder are the unary front's (`tokenizer_model`,
`encoder_model`), so ids and rows equal the ensemble's.
"""
import asyncio
import json

import triton_python_backend_utils as pb_utils

from engine_lib.errors import InputError
from engine_lib.service.outputs import requested_outputs
from rose_triton.batched import check_row_types, group_requests, merge_tokens, split_rows, texts_of
from rose_triton.errors import triton_error
from rose_triton.front import encoder_answer, exec_decoupled, initialize_front
from rose_wire import TEXT


class TritonPythonModel:
    def initialize(self, args):
        initialize_front(self, args, pb_utils)

    async def execute(self, requests):
        answers = [None] * len(requests)
        parsed, items = [], []
        for i, request in enumerate(requests):
            try:
                raw = request.parameters() or "{}"
                parameters = json.loads(raw)
                check_row_types(parameters)
                wanted = requested_outputs(parameters, request.requested_output_names(), self.outputs,
                                           self.default_outputs)
                texts = pb_utils.get_input_tensor_by_name(request, TEXT).as_numpy().reshape(-1)
            except (InputError, ValueError) as exc:
                answers[i] = _error(exc if isinstance(exc, InputError) else InputError(f"parameters: {exc}"))
                continue
            parsed.append((i, raw, parameters, wanted))
            items.append(({TEXT: texts}, parameters))
        tokenized = dict(zip((i for i, *_ in parsed), self.tokenize.many(items)))
        keyed = []
        for i, raw, parameters, wanted in parsed:
            if isinstance(tokenized[i], Exception):
                answers[i] = _error(tokenized[i])
            else:
                keyed.append((i, raw, parameters, wanted))
        groups = group_requests(keyed)
        await asyncio.gather(*(self._call(group, requests, tokenized, answers) for group in groups))
        return answers

    async def _call(self, group, requests, tokenized, answers):
        members = group.members
        try:
            first = requests[members[0]]
            bls = pb_utils.InferenceRequest(
                model_name=self.config.encoder_model,
                inputs=[pb_utils.Tensor(n, a) for n, a in merge_tokens([tokenized[i] for i in members]).items()],
                requested_output_names=list(group.outputs), parameters=group.parameters,
                **({"trace": first.trace()} if self.traced else {}))  # the group's first request's trace
            responses = await exec_decoupled(bls, self.config.encoder_model, self.config.bls_timeout_s,
                                             first.is_cancelled)
            tensors, error = encoder_answer(responses, group.outputs, self.config.encoder_model, pb_utils)
            if error is not None:  # the encoder's error: every member's
                for i in members:
                    answers[i] = pb_utils.InferenceResponse(error=error)
                return
            rows = {name: tensor.as_numpy() for name, tensor in zip(group.outputs, tensors)}
            for i, own in zip(members, split_rows(rows, [texts_of(tokenized[i]) for i in members])):
                answers[i] = pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(n, a) for n, a in own.items()])
        except Exception as exc:  # every request gets an answer
            for i in members:
                answers[i] = _error(exc)


def _error(exc):
    return pb_utils.InferenceResponse(error=triton_error(pb_utils, exc))
