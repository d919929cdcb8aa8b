"""Triton adapter (decoupled): requests -> engine_lib's Encoder (pool, FCFS batches, LazyTensors)."""
import time

import triton_python_backend_utils as pb_utils

from engine_lib.build import build_encoder
from engine_lib.config import EncoderConfig
from engine_lib.errors import InputError, OverloadError
from engine_lib.metrics import MetricsPublisher
from engine_lib.options import RequestOptions
from rose_triton.errors import client_message, code_name
from rose_triton.metrics import TritonMetricSink
from rose_triton.parameters import config_parameters, env_overrides

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _respond(sender, embeddings, error):
    if error is not None:
        code = getattr(pb_utils.TritonError, code_name(error))
        response = pb_utils.InferenceResponse(error=pb_utils.TritonError(client_message(error), code))
    else:
        response = pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("EMBEDDINGS", embeddings)])
    sender.send(response, flags=FINAL)


class TritonPythonModel:
    def initialize(self, args):
        try:
            config = EncoderConfig.from_parameters(config_parameters(args), **env_overrides(EncoderConfig))
            self.encoder = build_encoder(config)
        except Exception as exc:
            raise pb_utils.TritonModelException(f"{args['model_name']}: {exc}") from exc
        sink = TritonMetricSink(pb_utils, {"model": args["model_name"], "version": args["model_version"]})
        service = self.encoder.service
        self.publisher = MetricsPublisher(service.metrics, service.queue_depth, sink)

    def execute(self, requests):
        received_at = time.perf_counter()
        for request in requests:
            sender = request.get_response_sender()
            try:
                input_ids = pb_utils.get_input_tensor_by_name(request, "INPUT_IDS").as_numpy()
                seq_lens = pb_utils.get_input_tensor_by_name(request, "SEQ_LENS").as_numpy()
                options = RequestOptions.from_parameters(request.parameters())
                self.encoder.submit(input_ids, seq_lens, options,
                                    lambda rows, error, sender=sender: _respond(sender, rows, error),
                                    is_cancelled=sender.is_cancelled, received_at=received_at)
            except (InputError, OverloadError) as exc:
                _respond(sender, None, exc)
            except Exception as exc:  # every request gets exactly one final response
                pb_utils.Logger.log_error(f"rose_encoder: request failed: {exc!r}")
                _respond(sender, None, exc)
        return None

    def finalize(self):
        self.encoder.close()
        self.publisher.close()
