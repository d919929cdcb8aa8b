"""Triton adapter: TEXT -> flat INPUT_IDS + SEQ_LENS (engine_lib.tokenize_step.TextStep)."""
import triton_python_backend_utils as pb_utils

from engine_lib.errors import InputError
from engine_lib.tokenize_step import TextStep
from rose_triton.errors import client_message
from rose_triton.parameters import load_config


class TritonPythonModel:
    def initialize(self, args):
        try:
            self.step = TextStep(load_config(TextStep.config_cls, args))
        except Exception as exc:
            raise pb_utils.TritonModelException(f"{args['model_name']}: {exc}") from exc

    def execute(self, requests):
        return [self._tokenize(request) for request in requests]

    def _tokenize(self, request):
        try:
            tensors = self.step({"TEXT": pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()},
                                request.parameters())
        except InputError as exc:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(client_message(exc), pb_utils.TritonError.INVALID_ARG))
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(n, a) for n, a in tensors.items()])
