"""ROSE-style embedding engine: scheduling, packed ragged models, lazy results.

Importable and testable without Triton; the model_repository adapters are thin.
"""
