"""Triton adapter (decoupled): text inputs -> the encoder's flat INPUT_IDS + SEQ_LENS (engine_lib.tokenization.steps).

EXPERIMENT: execute() queues; one thread tokenizes every request waiting in one go and answers them.
"""
import collections
import threading

import triton_python_backend_utils as pb_utils

from engine_lib.errors import InputError
from engine_lib.tokenization.steps import step_for_inputs
from rose_triton.errors import triton_error
from rose_triton.faults import start_stub
from rose_triton.parameters import input_names, load_config

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def initialize(self, args):
        start_stub()
        try:
            self.inputs = input_names(args)
            step = step_for_inputs(self.inputs)
            self.step = step(load_config(step.config_cls, args))
        except Exception as exc:
            raise pb_utils.TritonModelException(f"{args['model_name']}: {exc}") from exc
        self.waiting = collections.deque()
        self.cond = threading.Condition()
        self.closing = False
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def execute(self, requests):
        items = []
        for request in requests:
            sender = request.get_response_sender()
            try:
                tensors = {n: pb_utils.get_input_tensor_by_name(request, n) for n in self.inputs}
                tensors = {n: (t.as_numpy() if t is not None else None) for n, t in tensors.items()}
            except Exception as exc:
                sender.send(pb_utils.InferenceResponse(error=triton_error(pb_utils, exc)), flags=FINAL)
                continue
            items.append((tensors, request.parameters(), sender))
        with self.cond:
            self.waiting.extend(items)
            self.cond.notify()
        return None

    def _loop(self):
        while True:
            with self.cond:
                while not self.waiting and not self.closing:
                    self.cond.wait()
                if not self.waiting:
                    return
                batch = list(self.waiting)
                self.waiting.clear()
            try:
                results = self.step.many([(t, p) for t, p, _ in batch])
            except Exception as exc:
                results = [exc] * len(batch)
            for (_, _, sender), result in zip(batch, results):
                if isinstance(result, Exception):
                    response = pb_utils.InferenceResponse(error=triton_error(pb_utils, result))
                else:
                    response = pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(n, a) for n, a in result.items()])
                sender.send(response, flags=FINAL)

    def finalize(self):
        with self.cond:
            self.closing = True
            self.cond.notify()
        self.thread.join(30)
