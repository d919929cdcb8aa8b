"""PNG for the overhead profile (plot venv: matplotlib): batch-1 p50 split into model and overhead,
and requests/s under concurrent clients, per server variant."""
from __future__ import annotations

from pathlib import Path


def plot(results: dict, path: Path) -> None:
    import matplotlib.pyplot as plt

    variants = results["variants"]
    paths = [p for p in results["paths"] if p != "padded"]  # far off the scale; in the report's table
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.5))
    width = 0.8 / len(variants)
    for i, name in enumerate(variants):
        xs = [j + i * width for j in range(len(paths))]
        rows = [results["paths"][p].get(name, {}) for p in paths]
        model = [r.get("model_ms", 0) for r in rows]
        over = [r.get("overhead_p50_ms", 0) for r in rows]
        left.bar(xs, model, width, color="0.6", label="model in-process" if i == 0 else None)
        left.bar(xs, over, width, bottom=model, color=f"C{i}", label=f"overhead ({name})")
    left.set_xticks([j + 0.4 - width / 2 for j in range(len(paths))], paths, rotation=30, fontsize=7)
    left.set(ylabel="batch-1 p50 ms", title="served p50 = model + overhead (padded baseline: see report)")
    left.legend(fontsize=7)
    cells = results.get("load", [])
    labels = [f"{c['path']} x{c['concurrency']}" for c in cells]
    for i, name in enumerate(variants):
        xs = [j + i * width for j in range(len(cells))]
        right.bar(xs, [c["results"].get(name, {}).get("requests_per_s", 0) for c in cells], width,
                  color=f"C{i}", label=name)
    right.set_xticks([j + 0.4 - width / 2 for j in range(len(cells))], labels, rotation=30, fontsize=7)
    right.set(ylabel="requests/s", title="concurrent single-text clients")
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
