"""Unary entry point: forwards TEXT to the decoupled `ensemble` through BLS."""
import asyncio
import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        return await asyncio.gather(*(self._forward(request) for request in requests))

    async def _forward(self, request):
        text = pb_utils.get_input_tensor_by_name(request, "TEXT")
        bls = pb_utils.InferenceRequest(
            model_name="ensemble", inputs=[text], requested_output_names=["EMBEDDINGS"],
            parameters=json.loads(request.parameters() or "{}"))
        responses = await bls.async_exec(decoupled=True)
        for response in responses:
            if response.has_error():
                return pb_utils.InferenceResponse(error=pb_utils.TritonError(response.error().message(), response.error().code()))
            embeddings = pb_utils.get_output_tensor_by_name(response, "EMBEDDINGS")
            if embeddings is not None:
                return pb_utils.InferenceResponse(output_tensors=[embeddings])
        return pb_utils.InferenceResponse(error=pb_utils.TritonError("ensemble returned no EMBEDDINGS"))
