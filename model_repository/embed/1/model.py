"""Unary entry point: forwards its inputs to a decoupled ensemble through BLS.

The same file serves every unary front of the assembled repository: `embed`
(-> `ensemble`, EMBEDDINGS) and `score` (-> `rerank`, SCORES). The target is
the `target_model` parameter; inputs and outputs are those config.pbtxt declares.
"""
import asyncio
import json

import triton_python_backend_utils as pb_utils

from rose_triton.errors import code_name_from_message
from rose_triton.parameters import config_parameters, input_names, output_names


def _error_response(error):
    # BLS hands every step error over as INTERNAL (Triton 2.51); the message's tag keeps the code.
    name = code_name_from_message(error.message())
    code = getattr(pb_utils.TritonError, name) if name else error.code()
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(error.message(), code))


class TritonPythonModel:
    def initialize(self, args):
        self.target = config_parameters(args).get("target_model", "ensemble")
        self.inputs, self.outputs = input_names(args), output_names(args)

    async def execute(self, requests):
        return await asyncio.gather(*(self._forward(request) for request in requests))

    async def _forward(self, request):
        try:
            return await self._call_ensemble(request)
        except Exception as exc:  # one request's failure must not fail the others in this execute
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(f"internal error: {exc}"))

    async def _call_ensemble(self, request):
        inputs = [t for t in (pb_utils.get_input_tensor_by_name(request, n) for n in self.inputs) if t is not None]
        bls = pb_utils.InferenceRequest(
            model_name=self.target, inputs=inputs, requested_output_names=self.outputs,
            parameters=json.loads(request.parameters() or "{}"))
        responses = await bls.async_exec(decoupled=True)
        for response in responses:
            if response.has_error():
                return _error_response(response.error())
            tensors = [pb_utils.get_output_tensor_by_name(response, n) for n in self.outputs]
            if all(t is not None for t in tensors):
                return pb_utils.InferenceResponse(output_tensors=tensors)
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(f"{self.target} returned no {self.outputs}"))
