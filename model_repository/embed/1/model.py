"""Unary entry point: forwards TEXT to the decoupled `ensemble` through BLS."""
import asyncio
import json

import triton_python_backend_utils as pb_utils

from rose_triton.errors import code_name_from_message


def _error_response(error):
    # BLS hands every step error over as INTERNAL (Triton 2.51); the message's tag keeps the code.
    name = code_name_from_message(error.message())
    code = getattr(pb_utils.TritonError, name) if name else error.code()
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(error.message(), code))


class TritonPythonModel:
    async def execute(self, requests):
        return await asyncio.gather(*(self._forward(request) for request in requests))

    async def _forward(self, request):
        try:
            return await self._call_ensemble(request)
        except Exception as exc:  # one request's failure must not fail the others in this execute
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(f"internal error: {exc}"))

    async def _call_ensemble(self, request):
        text = pb_utils.get_input_tensor_by_name(request, "TEXT")
        bls = pb_utils.InferenceRequest(
            model_name="ensemble", inputs=[text], requested_output_names=["EMBEDDINGS"],
            parameters=json.loads(request.parameters() or "{}"))
        responses = await bls.async_exec(decoupled=True)
        for response in responses:
            if response.has_error():
                return _error_response(response.error())
            embeddings = pb_utils.get_output_tensor_by_name(response, "EMBEDDINGS")
            if embeddings is not None:
                return pb_utils.InferenceResponse(output_tensors=[embeddings])
        return pb_utils.InferenceResponse(error=pb_utils.TritonError("ensemble returned no EMBEDDINGS"))
