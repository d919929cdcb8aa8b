"""Triton adapter: TEXT -> flat INPUT_IDS + SEQ_LENS (engine_lib.tokenization)."""
import numpy as np
import triton_python_backend_utils as pb_utils

from engine_lib.config import TokenizerConfig
from engine_lib.errors import InputError
from engine_lib.options import RequestOptions
from engine_lib.tokenization import TextTokenizer
from rose_triton.errors import client_message
from rose_triton.parameters import config_parameters, env_overrides


class TritonPythonModel:
    def initialize(self, args):
        try:
            config = TokenizerConfig.from_parameters(config_parameters(args), **env_overrides(TokenizerConfig))
            self.tokenizer = TextTokenizer(config.model_dir, config)
        except Exception as exc:
            raise pb_utils.TritonModelException(f"{args['model_name']}: {exc}") from exc

    def execute(self, requests):
        return [self._tokenize(request) for request in requests]

    def _tokenize(self, request):
        try:
            options = RequestOptions.from_parameters(request.parameters())
            texts = self.tokenizer.decode_texts(pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy())
            input_ids, seq_lens = self.tokenizer.encode(texts, options)
        except InputError as exc:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(client_message(exc), pb_utils.TritonError.INVALID_ARG))
        return pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("INPUT_IDS", input_ids),
            pb_utils.Tensor("SEQ_LENS", seq_lens.astype(np.int64)),
        ])
