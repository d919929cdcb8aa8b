"""Test and benchmark support: tiny random-weight models, fakes, clients, server helpers (no test code)."""
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]  # the checkout: model_repository/, scripts/, README.md
