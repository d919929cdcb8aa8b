"""Triton adapter: text inputs -> the encoder's flat INPUT_IDS + SEQ_LENS (engine_lib.tokenization.steps).

The same file serves every tokenizer model of the assembled repository: `tokenizer`
(TEXT -> TextStep) and `rerank_tokenizer` (QUERY + DOCUMENTS -> PairStep, which adds
TOKEN_TYPE_IDS); the step is the one that takes the inputs config.pbtxt declares.
"""
import triton_python_backend_utils as pb_utils

from engine_lib.errors import InputError
from engine_lib.tokenization.steps import step_for_inputs
from rose_triton.errors import triton_error
from rose_triton.faults import start_stub
from rose_triton.parameters import input_names, load_config


class TritonPythonModel:
    def initialize(self, args):
        start_stub()
        try:
            self.inputs = input_names(args)
            step = step_for_inputs(self.inputs)
            self.step = step(load_config(step.config_cls, args))
        except Exception as exc:
            raise pb_utils.TritonModelException(f"{args['model_name']}: {exc}") from exc

    def execute(self, requests):
        return [self._tokenize(request) for request in requests]

    def _tokenize(self, request):
        try:
            tensors = self.step({n: pb_utils.get_input_tensor_by_name(request, n).as_numpy() for n in self.inputs},
                                request.parameters())
        except InputError as exc:
            return pb_utils.InferenceResponse(error=triton_error(pb_utils, exc))
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(n, a) for n, a in tensors.items()])
