"""perf.soak's bookkeeping: request counts across a server restart, dead stubs, the table."""
from __future__ import annotations

import types

import perf.soak as soak


def test_counts_survive_a_restart_and_only_stubs_gone_while_ready_died(monkeypatch):
    counts = iter([(100, 0), (150, 2), (10, 1), (30, 1)])  # the third read is a fresh server
    stubs = iter([{1: "embed_0_0", 2: "embed_0_1"}, {1: "embed_0_0"}, {}, {5: "embed_0_0"}])
    ready = iter([True, True, False, True])
    monkeypatch.setattr(soak, "request_counts", lambda url, key: {"embed": next(counts)})
    monkeypatch.setattr(soak, "stub_pids", lambda pid: next(stubs))
    server = types.SimpleNamespace(http_url="x", process=types.SimpleNamespace(pid=0), is_ready=lambda: next(ready))
    watch = soak.Watch(server, "embed", "key", interval=3600)  # polled by hand below
    watch._poll_counts(), watch._poll_stubs()  # embed_0_1 gone while ready: it died
    watch._poll_counts(), watch._poll_stubs()  # restarting: embed_0_0 ends with its server
    watch.close()
    assert (watch.requests, watch.errors) == (52 + 11 + 20, 2 + 1 + 0)
    assert watch.died == {2: "embed_0_1"}
    assert set(watch.stubs) == {1, 2, 5}  # every stub seen, for the kernel log


def test_the_table_has_a_row_per_cell_and_names_what_failed():
    row = {"model": "embed", "concurrency": 64, "seconds": 60.0, "requests": 600, "errors": 1,
           "perf_analyzer_runs": 2, "perf_analyzer_failures": ["Thread [0] had error: x"],
           "stubs_died": ["embed_0_1 (pid 7)"], "watchdog_restarts": 1, "unhealthy_lines": 0, "segfault_lines": None}
    text = soak.markdown({"minutes": 1, "model": "near-free", "machine": {}, "rows": [row]})
    assert "| embed | 64 | 600 | 10.0 | 1 | 2 (1) | 1 | 1 | 0 | unreadable |" in text
    assert "- embed c64: Thread [0] had error: x; embed_0_1 (pid 7)" in text
