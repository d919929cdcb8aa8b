"""Benchmark harness: the seed's scenarios against ours and peers, same texts, same run.

Kept importable with only numpy and the standard library so in-process peer
workers can import `perf.measure` and `perf.peers.inproc` from their own venvs.
"""
