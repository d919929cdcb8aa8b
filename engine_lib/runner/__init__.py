"""The runner: one loaded model on one device, `step(PackedBatch) -> LazyTensor` (graphs, threads, budget, self-check)."""
