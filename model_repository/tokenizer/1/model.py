"""Triton adapter (decoupled): text inputs -> the encoder's flat INPUT_IDS + SEQ_LENS (engine_lib.tokenization.steps).

The same file serves every tokenizer model of the assembled repository: `tokenizer`
(TEXT -> TextStep) and `rerank_tokenizer` (QUERY + DOCUMENTS -> PairStep, which adds
TOKEN_TYPE_IDS); the step is the one that takes the inputs config.pbtxt declares.
`execute` only queues; the lane's thread tokenizes every waiting request in one group and
answers each through its response sender (engine_lib/tokenization/lane.py).
"""
import triton_python_backend_utils as pb_utils

from engine_lib.errors import InputError, OverloadError
from engine_lib.tokenization.lane import TokenizeLane
from engine_lib.tokenization.steps import step_for_inputs
from rose_triton.errors import triton_error
from rose_triton.faults import start_stub
from rose_triton.parameters import input_names, load_config

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def initialize(self, args):
        start_stub()
        try:
            self.inputs = input_names(args)
            step = step_for_inputs(self.inputs)
            config = load_config(step.config_cls, args)
            self.lane = TokenizeLane(step(config).many, _answer, config.max_waiting_requests)
        except Exception as exc:
            raise pb_utils.TritonModelException(f"{args['model_name']}: {exc}") from exc

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            tensors = {n: pb_utils.get_input_tensor_by_name(request, n) for n in self.inputs}
            try:
                self.lane.submit({n: None if t is None else t.as_numpy() for n, t in tensors.items()},
                                 request.parameters(), sender)
            except (InputError, OverloadError) as exc:
                _answer(sender, exc)
        return None

    def finalize(self):
        self.lane.close()


def _answer(sender, result):
    if isinstance(result, Exception):
        response = pb_utils.InferenceResponse(error=triton_error(pb_utils, result))
    else:
        response = pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(n, a) for n, a in result.items()])
    sender.send(response, flags=FINAL)
