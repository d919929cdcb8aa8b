"""Triton adapter: (QUERY, DOCUMENTS) -> flat INPUT_IDS + SEQ_LENS + TOKEN_TYPE_IDS (engine_lib.pair_tokenization)."""
import triton_python_backend_utils as pb_utils

from engine_lib.config import PairTokenizerConfig
from engine_lib.errors import InputError
from engine_lib.options import RerankOptions
from engine_lib.pair_tokenization import PairTokenizer
from rose_triton.errors import client_message
from rose_triton.parameters import load_config


class TritonPythonModel:
    def initialize(self, args):
        try:
            config = load_config(PairTokenizerConfig, args)
            self.tokenizer = PairTokenizer(config.model_dir, config)
        except Exception as exc:
            raise pb_utils.TritonModelException(f"{args['model_name']}: {exc}") from exc

    def execute(self, requests):
        return [self._tokenize(request) for request in requests]

    def _tokenize(self, request):
        try:
            options = RerankOptions.from_parameters(request.parameters())
            query, documents = self.tokenizer.decode(
                pb_utils.get_input_tensor_by_name(request, "QUERY").as_numpy(),
                pb_utils.get_input_tensor_by_name(request, "DOCUMENTS").as_numpy())
            input_ids, seq_lens, token_types = self.tokenizer.encode(query, documents, options)
        except InputError as exc:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(client_message(exc), pb_utils.TritonError.INVALID_ARG))
        return pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("INPUT_IDS", input_ids),
            pb_utils.Tensor("SEQ_LENS", seq_lens),
            pb_utils.Tensor("TOKEN_TYPE_IDS", token_types),
        ])
