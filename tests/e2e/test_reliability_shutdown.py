"""How model stubs end, on servers of their own: a graceful stop (SIGTERM to serve.sh) after
traffic on every path leaves no segfault of this server's stubs in the kernel log, and a stub
that dies of a fatal signal writes its Python traceback to the server's log first."""
from __future__ import annotations

import os
import re
import signal
from concurrent.futures import ThreadPoolExecutor

import pytest
import tritonclient.grpc as grpcclient

from rose_triton.server import TritonServer
from testing.crashes import kernel_log, new_lines, segfaults, stub_pids
from testing.embed_clients import embed_generate, embed_stream, embed_unary_grpc, embed_unary_http, unary_outputs
from testing.hold import wait_for_metric
from testing.waiting import wait_until

pytestmark = pytest.mark.own_server  # its own servers: scripts/test.sh runs it beside the shared-server tests

FATAL = "Fatal Python error: Segmentation fault"
DUMP_END = re.compile(r"Extension modules: .*\(total: \d+\)")


def test_a_graceful_stop_leaves_no_stub_segfault(tmp_path):
    before = kernel_log()
    if before is None:
        pytest.skip("the kernel log is unreadable here (dmesg refused, or exception-trace is 0): "
                    "a segfault could not be seen")
    server = TritonServer(tmp_path / "server.log", env={"ROSE_CACHE_DIR": str(tmp_path / "cache")})
    try:
        stubs = stub_pids(server.process.pid)
        assert {name.split("_0_")[0] for name in stubs.values()} >= {"embed", "rose_encoder", "tokenizer"}, stubs
        texts = ["a graceful stop", "leaves nothing behind"]
        with ThreadPoolExecutor(8) as pool:  # the unary front's instances work at once (BLS from each)
            unary = [pool.submit(embed_unary_grpc, server.grpc_url, texts) for _ in range(8)]
            unary += [pool.submit(embed_unary_http, server.http_url, texts) for _ in range(8)]
            assert all(f.result().shape == (2, 384) for f in unary)
        assert embed_stream(server.grpc_url, texts).shape == (2, 384)
        assert embed_generate(server.http_url, texts).shape == (2, 384)
        assert "EMBEDDINGS_INT8" in unary_outputs(grpcclient, server.grpc_url, texts, ("EMBEDDINGS_INT8",))
        # the encoder's metrics thread has exported them: its Metric objects exist and have been used
        wait_for_metric(server.metrics_url, 'rose_requests_total{model="rose_encoder",outcome="ok"', 19)
    finally:
        status = server.stop()
    assert status == 0, server.log_path.read_text(errors="replace")[-4000:]
    gone = [pid for pid in stubs if os.path.exists(f"/proc/{pid}")]
    assert not gone, f"stubs still running after the stop: {gone}"
    after = kernel_log()
    crashed = segfaults(new_lines(before, after or []), stubs)
    assert not crashed, f"stubs {stubs} segfaulted at the stop:\n" + "\n".join(crashed)
    log = server.log_path.read_text(errors="replace")
    assert FATAL not in log and "[watchdog]" not in log  # stubs ending in a stop are no fault


def test_a_stub_killed_by_a_fatal_signal_logs_its_python_traceback(tmp_path):
    server = TritonServer(tmp_path / "server.log", env={"ROSE_WATCHDOG": "0"})
    try:
        stubs = stub_pids(server.process.pid)
        for count, (pid, name) in enumerate(stubs.items(), 1):  # one at a time: their writes would interleave
            os.kill(pid, signal.SIGSEGV)
            # a dump ends with its list of extension modules: the next kill waits for the whole of this one
            wait_until(lambda: len(DUMP_END.findall(server.log_tail(400_000))) >= count, 60,
                       lambda: f"the traceback of {name}:\n{server.log_tail()}", 0.2)
    finally:
        server.kill()
    log = server.log_path.read_text(errors="replace")
    assert log.count(FATAL) == len(stubs), log[-4000:]
    assert "in _schedule_loop" in log  # every thread's traceback: the encoder's scheduler thread among them
