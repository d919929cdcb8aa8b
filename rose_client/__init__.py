"""Client for the ROSE embedding service: big jobs split into chunks over replicas."""
from .aio import JobFailed
from .chunking import Chunk, plan_chunks
from .client import EmbeddingClient
from .replicas import resolve_replicas
from .scheduling import RetryPolicy
from .tokens import ByteEstimator, TokenizerCounter

__all__ = ["ByteEstimator", "Chunk", "EmbeddingClient", "JobFailed", "RetryPolicy", "TokenizerCounter",
           "plan_chunks", "resolve_replicas"]
