"""Helpers shared by the reliability tests: processes, metrics, raw encoder calls."""
from __future__ import annotations

import os
import queue
import urllib.request

import tritonclient.grpc as grpcclient

from rose_wire import EMBEDDINGS, INPUT_IDS, ROSE_ENCODER, SEQ_LENS


def children(pid):
    """(pid, command line) of the processes whose parent is `pid`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue
        if parent == pid:
            found.append((int(entry), cmdline))
    return found


def metric_value(metrics_url, prefix):
    """Sum of every sample on the metrics page whose line starts with `prefix`."""
    body = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.splitlines() if line.startswith(prefix))


def encode_ids(grpc_url, input_ids, seq_lens, timeout=60):
    """One pre-tokenized request straight to rose_encoder (gRPC stream) -> (rows, None) or (None, error)."""
    client = grpcclient.InferenceServerClient(grpc_url)
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        inputs = [grpcclient.InferInput(INPUT_IDS, [len(input_ids)], "INT64"),
                  grpcclient.InferInput(SEQ_LENS, [len(seq_lens)], "INT64")]
        inputs[0].set_data_from_numpy(input_ids)
        inputs[1].set_data_from_numpy(seq_lens)
        client.async_stream_infer(ROSE_ENCODER, inputs)
        result, error = results.get(timeout=timeout)
    finally:
        client.stop_stream()
        client.close()
    return (None, error) if error is not None else (result.as_numpy(EMBEDDINGS), None)


def watchdog_lines_naming(instance, server):
    """The server log's `[watchdog]` lines that name model instance `instance` (the stub watch
    names it when its process ends; a probe that meets the dead instance first quotes Triton's
    `Stub process '<instance>' is not healthy`)."""
    log = server.log_path.read_text(errors="replace")
    return [line for line in log.splitlines() if line.startswith("[watchdog]") and instance in line]
