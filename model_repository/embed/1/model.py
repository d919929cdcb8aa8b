"""Unary entry point: tokenizes in this process, then calls the decoupled encoder through BLS.

The same file serves every unary front of the assembled repository: `embed`
(TEXT -> `rose_encoder`, EMBEDDINGS) and `score` (QUERY + DOCUMENTS ->
`rerank_encoder`, SCORES). The tokenize step (engine_lib.tokenization.steps) is the
one the `tokenizer_model` runs, built from that model's config.pbtxt parameters
and ROSE_* environment, so ids equal the ensemble's; the encoder is `encoder_model`,
which must answer within `bls_timeout_s` (rose_triton/front.py). It asks the encoder for
the outputs its client wants (engine_lib/service/outputs.py: requested_outputs). Each
instance answers up to `max_requests_in_flight` requests at once (rose_triton/front.py:
AnswerLoop).
"""
import json

import triton_python_backend_utils as pb_utils

from engine_lib.errors import OverloadError
from engine_lib.service.outputs import requested_outputs
from rose_triton.errors import triton_error
from rose_triton.front import AnswerLoop, encoder_answer, exec_decoupled, initialize_front

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _send_final(sender, response):
    try:
        sender.send(response, flags=FINAL)
    except Exception as exc:  # the client is gone or the server stops: nothing else to answer
        pb_utils.Logger.log_warn(f"unary front: could not send a response: {exc!r}")


class TritonPythonModel:
    def initialize(self, args):
        initialize_front(self, args, pb_utils)
        self.name = args["model_name"]
        self.answers = AnswerLoop(self.name, self.config.max_requests_in_flight, self._answer,
                                  self._overloaded, _send_final)

    def execute(self, requests):
        for request in requests:
            self.answers.submit(request, wait=self.traced)
        return None

    def _overloaded(self, limit):
        return pb_utils.InferenceResponse(error=triton_error(pb_utils, OverloadError(
            f"{self.name} has {limit} requests in flight in this instance (parameter "
            f"max_requests_in_flight); retry, or on another replica")))

    def finalize(self):
        self.answers.close()

    async def _answer(self, request):
        try:
            return await self._encode(request)
        except Exception as exc:  # an InputError is INVALID_ARG; no failure fails the others in this execute
            return pb_utils.InferenceResponse(error=triton_error(pb_utils, exc))

    async def _encode(self, request):
        parameters = json.loads(request.parameters() or "{}")  # parsed once: for the tokenize step and the encoder
        arrays = {}
        for name in self.inputs:
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            arrays[name] = None if tensor is None else tensor.as_numpy()
        tensors = self.tokenize(arrays, parameters)
        wanted = requested_outputs(parameters, request.requested_output_names(), self.outputs, self.default_outputs)
        encoder = self.config.encoder_model
        bls = pb_utils.InferenceRequest(
            model_name=encoder, inputs=[pb_utils.Tensor(n, a) for n, a in tensors.items()],
            requested_output_names=wanted, parameters=parameters,
            **({"trace": request.trace()} if self.traced else {}))  # Triton's trace goes on into the encoder
        responses = await exec_decoupled(bls, encoder, self.config.bls_timeout_s, request.is_cancelled)
        outputs, error = encoder_answer(responses, wanted, encoder, pb_utils)
        if error is not None:
            return pb_utils.InferenceResponse(error=error)
        return pb_utils.InferenceResponse(output_tensors=outputs)
