"""Triton model (copied into a generated repository by perf/overhead.py): the Python backend's floor.

Decoupled, same inputs and output as rose_encoder, no work: each request is
answered with zeros [N, dim], from execute itself ("execute") or from a
background thread ("thread", one hand-off like the encoder's). With a TEXT input
it is the tokenizer's floor instead: one token id per text, answered from execute.
"""
import json
import queue
import threading

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.tokenizer = any(i["name"] == "TEXT" for i in config["input"])
        if self.tokenizer:
            return
        params = {k: v["string_value"] for k, v in config["parameters"].items()}
        self.dim = int(params["dim"])
        self.queue = None
        if params["answer_from"] == "thread":
            self.queue = queue.Queue()
            threading.Thread(target=self._answer_loop, daemon=True).start()

    def _tokens(self, num_texts):
        return pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("INPUT_IDS", np.zeros(num_texts, dtype=np.int64)),
            pb_utils.Tensor("SEQ_LENS", np.ones(num_texts, dtype=np.int64))])

    def _answer(self, sender, num_rows):
        out = pb_utils.Tensor("EMBEDDINGS", np.zeros((num_rows, self.dim), dtype=np.float32))
        sender.send(pb_utils.InferenceResponse(output_tensors=[out]), flags=FINAL)

    def _answer_loop(self):
        while True:
            self._answer(*self.queue.get())

    def execute(self, requests):
        if self.tokenizer:
            return [self._tokens(pb_utils.get_input_tensor_by_name(r, "TEXT").as_numpy().size) for r in requests]
        for request in requests:
            num_rows = pb_utils.get_input_tensor_by_name(request, "SEQ_LENS").as_numpy().size
            if self.queue is None:
                self._answer(request.get_response_sender(), num_rows)
            else:
                self.queue.put((request.get_response_sender(), num_rows))
        return None
