"""The `overhead` profile: what the server itself costs per request, next to a near-free model.

Kept import-light (the plot venv imports perf.overhead.plot).
"""
