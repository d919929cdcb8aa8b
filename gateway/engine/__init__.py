"""The Triton side of the gateway: tokenizing, routing a `model` to Triton models, and the backend that sends chunks to the replicas."""
