"""Triton adapter: text inputs -> the encoder's flat INPUT_IDS + SEQ_LENS (engine_lib.tokenization.steps).

The same file serves every tokenizer model of the assembled repository: `tokenizer`
(TEXT -> TextStep) and `rerank_tokenizer` (QUERY + DOCUMENTS -> PairStep, which adds
TOKEN_TYPE_IDS); the step is the one that takes the inputs config.pbtxt declares.
Triton's dynamic batcher hands `execute` every request that queued meanwhile (the inputs are
ragged, so each request keeps its own length); the step tokenizes them as one group and the
answers go back in one batch (engine_lib/tokenization/grouped.py).
"""
import triton_python_backend_utils as pb_utils

from engine_lib.tokenization.grouped import tokenize_group
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
            self.many = step(load_config(step.config_cls, args)).many
        except Exception as exc:
            raise pb_utils.TritonModelException(f"{args['model_name']}: {exc}") from exc

    def execute(self, requests):
        group = [({n: _unbatched(pb_utils.get_input_tensor_by_name(r, n)) for n in self.inputs}, r.parameters())
                 for r in requests]
        return [_response(result) for result in tokenize_group(self.many, group)]


def _unbatched(tensor):
    """A request's input with the batch dimension Triton gives it merged into the next: the ensemble
    sends one row ([1, N] -> [N]); a direct caller's [B, 1] keeps all of its B texts."""
    if tensor is None:
        return None
    array = tensor.as_numpy()
    return array.reshape((-1,) + array.shape[2:])


def _response(result):
    if isinstance(result, Exception):
        return pb_utils.InferenceResponse(error=triton_error(pb_utils, result))
    return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(n, a) for n, a in result.items()])
