"""Triton adapter (decoupled): requests -> engine_lib's Endpoint (pool, priority-class batches, LazyTensors).

The same file serves every encoder of the assembled repository: `rose_encoder`
(task embed -> EMBEDDINGS and its compact types) and `rerank_encoder` (task score ->
SCORES, with optional TOKEN_TYPE_IDS); its first declared output is the one the
task gives. Which outputs a request gets: engine_lib/service/outputs.py (select_outputs).
"""
import dataclasses
import time

import triton_python_backend_utils as pb_utils

from engine_lib.config import EncoderConfig
from engine_lib.contract import RaggedTokens
from engine_lib.errors import InputError, OverloadError
from engine_lib.service.build import build_endpoint
from engine_lib.service.metrics import MetricsPublisher
from engine_lib.tracing import split_parameters, tracer
from engine_lib.tokenization.calibration import calibration_sequences
from rose_triton.errors import triton_error
from rose_triton.faults import start_stub
from rose_triton.metrics import TritonMetricSink
from rose_triton.parameters import input_names, instance_device, load_config, output_names
from rose_wire import INPUT_IDS, SEQ_LENS, TEXT_WINDOWS, TOKEN_TYPE_IDS

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _respond(sender, result, error):
    if error is not None:
        response = pb_utils.InferenceResponse(error=triton_error(pb_utils, error))
    else:
        response = pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(n, a) for n, a in result.items()])
    sender.send(response, flags=FINAL)


def _triton_context(request, tracer):
    """The context of Triton's own trace of `request` (a client's traceparent that Triton adopted, or
    a trace it sampled), so direct calls (ensemble, embed) get the encoder's spans too; () when off."""
    if tracer is None:
        return ()
    from engine_lib.otel import triton_context

    return triton_context(request.trace())


def _optional_input(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


class TritonPythonModel:
    def initialize(self, args):
        start_stub()
        try:
            config = load_config(EncoderConfig, args)
            self.encoder = build_endpoint(dataclasses.replace(config, device=instance_device(args, config.device)),
                                          calibration_sequences)
            self.outputs = output_names(args)
            self.takes_token_types = TOKEN_TYPE_IDS in input_names(args)
            self.takes_windows = TEXT_WINDOWS in input_names(args)
            if self.outputs[0] != self.encoder.output.name:
                raise ValueError(f"config.pbtxt declares output {self.outputs[0]!r} first but the task gives "
                                 f"{self.encoder.output.name!r}")
        except Exception as exc:
            raise pb_utils.TritonModelException(f"{args['model_name']}: {exc}") from exc
        self.sink = TritonMetricSink(pb_utils, {"model": args["model_name"], "version": args["model_version"]})
        self.publisher = MetricsPublisher(self.encoder.service.metrics, self.encoder.gauges, self.sink)
        self.tracer, self.name = tracer("rose-triton"), args["model_name"]

    def execute(self, requests):
        received_at = time.perf_counter()
        output, name = self.encoder.output, self.outputs[0]
        for request in requests:
            sender = request.get_response_sender()
            try:
                parameters, parents = split_parameters(request.parameters())
                options = output.select(output.options_type.from_parameters(parameters),
                                        request.requested_output_names(), self.outputs)
                tokens = RaggedTokens(
                    pb_utils.get_input_tensor_by_name(request, INPUT_IDS).as_numpy(),
                    pb_utils.get_input_tensor_by_name(request, SEQ_LENS).as_numpy(),
                    _optional_input(request, TOKEN_TYPE_IDS) if self.takes_token_types else None,
                    _optional_input(request, TEXT_WINDOWS) if self.takes_windows else None, options)
                self.encoder.submit(tokens, lambda result, error, sender=sender: _respond(sender, result, error),
                                    is_cancelled=sender.is_cancelled, received_at=received_at,
                                    trace=self._trace(parents or _triton_context(request, self.tracer), tokens.seq_lens))
            except (InputError, OverloadError) as exc:
                _respond(sender, None, exc)
            except Exception as exc:  # every request gets exactly one final response
                pb_utils.Logger.log_error(f"{name} encoder: request failed: {exc!r}")
                _respond(sender, None, exc)
        return None

    def _trace(self, parents, seq_lens):
        """The request's trace hook (engine_lib/otel.py), None when traces are off or it has no context."""
        if self.tracer is None or not parents:
            return None
        from engine_lib.otel import encoder_spans

        attributes = {"rose.model": self.name, "rose.sequences": len(seq_lens), "rose.tokens": int(seq_lens.sum())}
        return lambda r, sent_at: encoder_spans(self.tracer, self.name, parents, r, sent_at, attributes)

    def finalize(self):
        self.encoder.close()
        self.publisher.close()
        self.sink.close()  # while the stub lives (rose_triton/metrics.py)
