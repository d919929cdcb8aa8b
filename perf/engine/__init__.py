"""In-process engine profiles, no Triton: `engine-cpu`, `gpu-served`, `gpu-latency` (docs/benchmarks.md)."""
