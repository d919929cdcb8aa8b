"""PNG plots from a results JSON (run in the plot venv: matplotlib is a perf-only dependency)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _ok(result: dict) -> bool:
    return "error" not in result and "skipped" not in result


def _metric(cell: dict, name: str, key: str) -> float:
    result = cell["results"].get(name, {})
    return result.get(key, 0) if _ok(result) else 0


def bar_plot(results: dict, scenario: str, cells: list[dict], path: Path,
             layers: tuple[tuple[str, float], ...], ylabel: str) -> None:
    """One group of bars per cell, one bar per target; `layers` (metric, alpha) drawn back to front."""
    names = list(results["targets"])
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(cells) * len(names) / 2), 4))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        xs = [j + i * width for j in range(len(cells))]
        for key, alpha in layers:
            ax.bar(xs, [_metric(c, name, key) for c in cells], width, alpha=alpha, color=f"C{i}",
                   label=name if alpha == 1 else None)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cells))], [c["label"] for c in cells], fontsize=7)
    ax.set_ylabel(ylabel)
    ax.set_title(f"{results['profile']}: {scenario}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def concurrency_plot(results: dict, scenario: str, cells: list[dict], path: Path) -> None:
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for i, name in enumerate(results["targets"]):
        points = [(c["concurrency"], c["results"][name]) for c in cells if _ok(c["results"].get(name, {}))]
        if not points:
            continue
        xs = [p[0] for p in points]
        left.plot(xs, [p[1]["embeddings_per_s"] for p in points], "o-", label=name, color=f"C{i}")
        right.plot(xs, [p[1]["p50_ms"] for p in points], "o-", label=f"{name} p50", color=f"C{i}")
        right.plot(xs, [p[1]["p99_ms"] for p in points], "x--", color=f"C{i}", alpha=0.6)
    left.set(xlabel="concurrent clients", ylabel="embeddings/s", title=f"{scenario}: throughput")
    right.set(xlabel="concurrent clients", ylabel="ms (o p50, x p99)", title="latency")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(json_path: str) -> None:
    path = Path(json_path)
    results = json.loads(path.read_text())
    if results["profile"] == "overhead":
        from perf.overhead.plot import plot

        plot(results, path.with_suffix(".png"))
        print(f"[perf] plot {path.with_suffix('.png')}", file=sys.stderr)
        return
    scenarios: dict[str, list[dict]] = {}
    for cell in results["cells"]:
        scenarios.setdefault(cell["scenario"], []).append(cell)
    for k, (scenario, cells) in enumerate(scenarios.items(), 1):
        out = path.with_name(f"{results['profile']}-{k}.png")
        if cells[0]["mode"] == "sequential":
            bar_plot(results, scenario, cells, out, (("p99_ms", 0.35), ("p50_ms", 1)), "ms (solid p50, light p99)")
        elif len({c["concurrency"] for c in cells}) > 1 and len({c["seq_len"] for c in cells}) == 1:
            concurrency_plot(results, scenario, cells, out)
        else:
            bar_plot(results, scenario, cells, out, (("embeddings_per_s", 1),), "embeddings/s")
        print(f"[perf] plot {out}", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1])
