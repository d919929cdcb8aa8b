"""perf_analyzer set-up (install.sh) and sweeps over concurrency and request size (sweep.py)."""
