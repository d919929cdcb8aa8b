"""Client for the ROSE embedding service: big jobs split into chunks over replicas."""
from .chunking import Chunk, plan_chunks
from .client import EmbeddingClient
from .dispatch import JobFailed, RetryPolicy
from .replicas import resolve_replicas
from .tokens import ByteEstimator, TokenizerCounter

__all__ = ["ByteEstimator", "Chunk", "EmbeddingClient", "JobFailed", "RetryPolicy", "TokenizerCounter",
           "plan_chunks", "resolve_replicas"]
