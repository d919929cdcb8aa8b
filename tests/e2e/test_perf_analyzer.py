"""CI keeps the perf_analyzer set-up and sweep working: one short sweep on every entry."""
from perf.perf_analyzer.sweep import markdown, sweep


def test_short_perf_analyzer_sweep(server):
    results = sweep({"shared": server.grpc_url}, concurrency=[2], sizes=[2], seq_len=32, entries=["ensemble", "embed", "embed_batched"],
                    request_count=4, timeout=120, stability=1000, max_trials=3,
                    admin_key=server.admin_key)  # no stability demand: CI checks it works
    assert {r["model"] for r in results["rows"]} == {"ensemble", "embed", "embed_batched"}
    assert all(r["embeddings_per_s"] > 0 and r["p50_ms"] > 0 for r in results["rows"])
    assert "| shared | ensemble | 2 | 2 |" in markdown(results)
