"""Peers measured in the same run: in-process libraries and other servers, each in its own venv."""
