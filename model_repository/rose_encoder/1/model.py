"""Triton adapter (decoupled): requests -> engine_lib's Endpoint (pool, priority-class batches, LazyTensors).

The same file serves every encoder of the assembled repository: `rose_encoder`
(task embed -> EMBEDDINGS) and `rerank_encoder` (task score -> SCORES, with
optional TOKEN_TYPE_IDS); the output name is the one its config.pbtxt declares.
"""
import dataclasses
import time

import triton_python_backend_utils as pb_utils

from engine_lib.config import EncoderConfig
from engine_lib.errors import InputError, OverloadError
from engine_lib.service.build import build_endpoint
from engine_lib.service.metrics import MetricsPublisher
from rose_triton.errors import triton_error
from rose_triton.metrics import TritonMetricSink
from rose_triton.parameters import input_names, instance_device, load_config, output_names
from rose_wire import INPUT_IDS, SEQ_LENS, TOKEN_TYPE_IDS

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _respond(sender, name, result, error):
    if error is not None:
        response = pb_utils.InferenceResponse(error=triton_error(pb_utils, error))
    else:
        response = pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(name, result)])
    sender.send(response, flags=FINAL)


def _optional_input(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


class TritonPythonModel:
    def initialize(self, args):
        try:
            config = load_config(EncoderConfig, args)
            self.encoder = build_endpoint(dataclasses.replace(config, device=instance_device(args, config.device)))
            self.output_name = output_names(args)[0]
            self.takes_token_types = TOKEN_TYPE_IDS in input_names(args)
            if self.output_name != self.encoder.output.name:
                raise ValueError(f"config.pbtxt declares output {self.output_name!r} but the task gives "
                                 f"{self.encoder.output.name!r}")
        except Exception as exc:
            raise pb_utils.TritonModelException(f"{args['model_name']}: {exc}") from exc
        sink = TritonMetricSink(pb_utils, {"model": args["model_name"], "version": args["model_version"]})
        self.publisher = MetricsPublisher(self.encoder.service.metrics, self.encoder.gauges, sink)

    def execute(self, requests):
        received_at = time.perf_counter()
        name, options_type = self.output_name, self.encoder.output.options_type
        for request in requests:
            sender = request.get_response_sender()
            try:
                input_ids = pb_utils.get_input_tensor_by_name(request, INPUT_IDS).as_numpy()
                seq_lens = pb_utils.get_input_tensor_by_name(request, SEQ_LENS).as_numpy()
                options = options_type.from_parameters(request.parameters())
                self.encoder.submit(input_ids, seq_lens, options,
                                    lambda result, error, sender=sender: _respond(sender, name, result, error),
                                    is_cancelled=sender.is_cancelled,
                                    token_types=_optional_input(request, TOKEN_TYPE_IDS) if self.takes_token_types else None,
                                    received_at=received_at)
            except (InputError, OverloadError) as exc:
                _respond(sender, name, None, exc)
            except Exception as exc:  # every request gets exactly one final response
                pb_utils.Logger.log_error(f"{name} encoder: request failed: {exc!r}")
                _respond(sender, name, None, exc)
        return None

    def finalize(self):
        self.encoder.close()
        self.publisher.close()
