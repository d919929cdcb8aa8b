"""Benchmark harness: `python -m perf run --profile NAME` (docs/benchmarks.md).

Kept importable with only numpy and the standard library so that in-process peer
workers can import `perf.measure`, `perf.machine` and `perf.peers.inproc` from their own venvs.
"""
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PEERS = REPO / "perf" / ".peers"        # one venv per peer (git-ignored)
RESULTS = REPO / "perf" / "results"     # one folder per machine kind, one file per profile
