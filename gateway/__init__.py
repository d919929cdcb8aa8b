"""OpenAI-compatible HTTP gateway: tokenizes, splits and balances over Triton replicas."""
