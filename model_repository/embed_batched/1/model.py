"""Batched unary front: Triton's dynamic batcher hands over several requests (one text per batch row);
the texts are tokenized together and each group with the same options is one BLS call to the encoder
(rose_triton/batched.py: answer_together). Its tokenizer and encoder are the unary front's
(`tokenizer_model`, `encoder_model`), so ids and rows equal the ensemble's.
"""
import asyncio

import triton_python_backend_utils as pb_utils

from engine_lib.service.outputs import requested_outputs
from rose_triton.batched import Ask, answer_together, check_row_types, read_parameters
from rose_triton.front import initialize_front
from rose_wire import TEXT


class TritonPythonModel:
    def initialize(self, args):
        initialize_front(self, args, pb_utils)

    async def execute(self, requests):
        return list(await asyncio.gather(*answer_together(requests, self._read, self, pb_utils)))

    def _read(self, request):
        raw, parameters = read_parameters(request)
        check_row_types(parameters)
        wanted = tuple(requested_outputs(parameters, request.requested_output_names(), self.outputs,
                                         self.default_outputs))
        texts = pb_utils.get_input_tensor_by_name(request, TEXT).as_numpy().reshape(-1)
        return Ask(raw, parameters, wanted, {TEXT: texts}, shareable=not self.traced)
