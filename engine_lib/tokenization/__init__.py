"""Texts and pairs -> flat token ids for the encoder (templates, truncation, request limits)."""
