"""The Triton side of the gateway: tokenizing, routing a request's `model` to Triton models, and the
backend that sends chunks to the replicas."""
