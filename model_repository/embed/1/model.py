"""Unary entry point: tokenizes in this process, then calls the decoupled encoder through BLS.

The same file serves every unary front of the assembled repository: `embed`
(TEXT -> `rose_encoder`, EMBEDDINGS) and `score` (QUERY + DOCUMENTS ->
`rerank_encoder`, SCORES). The tokenize step (engine_lib.tokenization.steps) is the
one the `tokenizer_model` runs, built from that model's config.pbtxt parameters
and ROSE_* environment, so ids equal the ensemble's; the encoder is `encoder_model`,
which must answer within `bls_timeout_s` (rose_triton/front.py). It asks the encoder for
the outputs its client wants (engine_lib/service/outputs.py: requested_outputs). Each
instance answers up to `max_requests_in_flight` requests at once (rose_triton/front.py:
AnswerLoop); those waiting together are tokenized together and share encoder calls
(rose_triton/batched.py: answer_together).
"""
import triton_python_backend_utils as pb_utils

from engine_lib.errors import OverloadError
from engine_lib.service.outputs import requested_outputs
from rose_triton.batched import SHAREABLE_OUTPUTS, Ask, answer_together, read_parameters
from rose_triton.errors import triton_error
from rose_triton.front import AnswerLoop, initialize_front

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _send_final(sender, response):
    try:
        sender.send(response, flags=FINAL)
    except Exception as exc:  # the client is gone or the server stops: nothing else to answer
        pb_utils.Logger.log_warn(f"unary front: could not send a response: {exc!r}")


def _error(exc):
    return pb_utils.InferenceResponse(error=triton_error(pb_utils, exc))


class TritonPythonModel:
    def initialize(self, args):
        initialize_front(self, args, pb_utils)
        self.name = args["model_name"]
        self.answers = AnswerLoop(self.name, self.config.max_requests_in_flight,
                                  lambda requests: answer_together(requests, self._read, self, pb_utils),
                                  self._overloaded, _send_final, _error)

    def execute(self, requests):
        for request in requests:
            self.answers.submit(request, wait=self.traced)
        return None

    def _overloaded(self, limit):
        return _error(OverloadError(f"{self.name} has {limit} requests in flight in this instance (parameter "
                                    f"max_requests_in_flight); retry, or on another replica"))

    def finalize(self):
        self.answers.close()

    def _read(self, request):
        raw, parameters = read_parameters(request)
        arrays = {}
        for name in self.inputs:
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            arrays[name] = None if tensor is None else tensor.as_numpy()
        wanted = tuple(requested_outputs(parameters, request.requested_output_names(), self.outputs,
                                         self.default_outputs))
        return Ask(raw, parameters, wanted, arrays, shareable=not self.traced and SHAREABLE_OUTPUTS.issuperset(wanted))
