"""Triton adapter: (QUERY, DOCUMENTS) -> flat INPUT_IDS + SEQ_LENS + TOKEN_TYPE_IDS (engine_lib.tokenize_step.PairStep)."""
import triton_python_backend_utils as pb_utils

from engine_lib.errors import InputError
from engine_lib.tokenize_step import PairStep
from rose_triton.errors import client_message
from rose_triton.parameters import load_config


class TritonPythonModel:
    def initialize(self, args):
        try:
            self.step = PairStep(load_config(PairStep.config_cls, args))
        except Exception as exc:
            raise pb_utils.TritonModelException(f"{args['model_name']}: {exc}") from exc

    def execute(self, requests):
        return [self._tokenize(request) for request in requests]

    def _tokenize(self, request):
        try:
            tensors = self.step({n: pb_utils.get_input_tensor_by_name(request, n).as_numpy() for n in PairStep.inputs},
                                request.parameters())
        except InputError as exc:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(client_message(exc), pb_utils.TritonError.INVALID_ARG))
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(n, a) for n, a in tensors.items()])
