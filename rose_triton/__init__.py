"""Triton boundary: what the model.py adapters, tests and benchmarks share about Triton itself
(error codes, metric sink, config parameters, starting a real tritonserver). engine_lib never imports it."""
