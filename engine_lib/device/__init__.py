"""Device plumbing: lazy device-to-host results, staged inputs, the CUDA/driver check."""
