"""Triton adapter (decoupled): pool requests into engine_lib's EncoderService."""
import triton_python_backend_utils as pb_utils

from engine_lib.config import EncoderConfig
from engine_lib.errors import InputError, OverloadError, client_message, code_name
from engine_lib.metrics import MetricsPublisher, TritonMetricSink
from engine_lib.options import RequestOptions
from engine_lib.serving import build_service
from engine_lib.triton_adapter import config_parameters, env_overrides

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
            self.service = build_service(config)
        except Exception as exc:
            raise pb_utils.TritonModelException(f"{args['model_name']}: {exc}") from exc
        sink = TritonMetricSink(pb_utils, {"model": args["model_name"], "version": args["model_version"]})
        self.publisher = MetricsPublisher(self.service.metrics, self.service.queue_depth, sink)

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                input_ids = pb_utils.get_input_tensor_by_name(request, "INPUT_IDS").as_numpy()
                seq_lens = pb_utils.get_input_tensor_by_name(request, "SEQ_LENS").as_numpy()
                options = RequestOptions.from_parameters(request.parameters())
                self.service.submit(input_ids, seq_lens, options,
                                    lambda rows, error, sender=sender: _respond(sender, rows, error),
                                    is_cancelled=sender.is_cancelled)
            except (InputError, OverloadError) as exc:
                _respond(sender, None, exc)
            except Exception as exc:  # every request gets exactly one final response
                pb_utils.Logger.log_error(f"rose_encoder: request failed: {exc!r}")
                _respond(sender, None, exc)
        return None

    def finalize(self):
        self.service.close()
        self.publisher.close()
