"""Results JSON of a cells profile -> markdown report; all results -> the README's performance table.
Ratios are ours (`rose`) vs each other target: > 1 means ours is better."""
from __future__ import annotations

import json
from pathlib import Path

from engine_lib.runner.self_check import MIN_COSINE

from .machine import machine_line, vector_isa

OURS = "rose"
OURS_IN_PROCESS, IN_PROCESS_PEERS = "rose-inproc", ("st", "ort")  # compared with each other too
FLOORS = ("rose-floor",)  # what ours costs doing no work: in the reports, not in the README's table
README_PROFILES = ("gateway", "gateway-nearfree", "cpu", "seed", "gpu-served")  # overhead: docs/benchmarks.md
README_BEGIN, README_END = "<!-- perf-table:begin (python -m perf readme-table --write) -->", "<!-- perf-table:end -->"


def speedup(cell: dict, ours: dict, peer: dict) -> float | None:
    """> 1 means ours is better: peer ms / our ms, or our emb/s / peer emb/s."""
    metric = cell["metric"]
    if not ours.get(metric) or not peer.get(metric):
        return None
    return peer[metric] / ours[metric] if metric.endswith("_ms") else ours[metric] / peer[metric]


def _value(cell: dict, result: dict) -> str:
    if "skipped" in result:
        return "skipped"
    if "error" in result:
        return "**failed**"
    if cell["mode"] == "sequential":
        return " / ".join(f"{result[k]:.1f}" for k in ("p50_ms", "p90_ms", "p99_ms", "max_ms"))
    if cell["metric"] == "embeddings_per_s":
        return f"{result['embeddings_per_s']:.1f} emb/s (p50 {result['p50_ms']:.0f} ms)"
    return f"{result['p50_ms']:.1f} / {result['p99_ms']:.1f} ms, {result['embeddings_per_s']:.0f} emb/s"


def _targets(results: dict) -> list[str]:
    names = list(results["targets"])
    return [OURS] + [n for n in names if n != OURS] if OURS in names else names


def scenario_tables(results: dict) -> list[str]:
    names = _targets(results)
    peers = [n for n in names if n != OURS]
    in_process = [p for p in IN_PROCESS_PEERS if p in names] if OURS_IN_PROCESS in names else []
    scenarios: dict[str, list[dict]] = {}
    for cell in results["cells"]:
        scenarios.setdefault(cell["scenario"], []).append(cell)
    lines: list[str] = []
    for scenario, cells in scenarios.items():
        unit = ("p50 / p90 / p99 / max ms" if cells[0]["mode"] == "sequential" else "embeddings/s (p50 latency)"
                if cells[0]["metric"] == "embeddings_per_s" else "p50 / p99 ms, embeddings/s")
        lines += [f"### {scenario} ({unit})", "", "| " + " | ".join(
            ["cell", *names, *(f"ours vs {p}" for p in peers), *(f"ours in-process vs {p}" for p in in_process)])
                  + " |", "|---" * (1 + len(names) + len(peers) + len(in_process)) + "|"]
        for cell in cells:
            res = cell["results"]
            ratios = [speedup(cell, res.get(OURS, {}), res.get(p, {})) for p in peers]
            ratios += [speedup(cell, res.get(OURS_IN_PROCESS, {}), res.get(p, {})) for p in in_process]
            lines.append("| " + " | ".join([cell["label"], *(_value(cell, res.get(n, {"skipped": 1})) for n in names),
                                            *(f"{r:.2f}x" if r else "-" for r in ratios)]) + " |")
        notes = [f"- `{cell['key']}` {n}: {cell['results'][n]['error']}" for cell in cells
                 for n in names if "error" in cell["results"].get(n, {})]
        busy = [r["machine_busy_before"] for cell in cells for r in cell["results"].values()
                if "machine_busy_before" in r]
        if busy:
            notes.append(f"- Machine busy just before timing (anyone's work): {min(busy):.0%} to {max(busy):.0%}")
        lines += [""] + notes + ([""] if notes else [])
    return lines


def markdown(results: dict) -> str:
    m = results["machine"]
    lines = [f"# Benchmark `{results['profile']}`: {m['date']}", "", results["description"], "",
             f"- Machine: {machine_line(m)}", f"- Commit: `{m['git_commit']}`; model: {results['model']['name']}",
             "- Packages (harness): " + ", ".join(f"{k} {v}" for k, v in m["packages"].items())]
    if results.get("gemm"):
        g = results["gemm"]
        lines.append(f"- Dense GEMM: {g['flops_per_s'] / 1e9:.1f} GFLOP/s ({g['dtype']}, n={g['n']})")
    lines += [f"- Note: {n}" for n in results["notes"]] + ["", "Targets:", ""]
    for name in _targets(results):
        info = results["targets"][name]
        versions = ", ".join(f"{k} {v}" for k, v in info.get("versions", {}).items())
        lines.append(f"- `{name}`: {info.get('label', name)}" + (f" ({versions})" if versions else ""))
    check = results.get("check") or (  # in-process profiles say how they checked
        "Every timed cell was preceded by warm-up requests whose every row was checked against "
        f"sentence-transformers (cosine >= {MIN_COSINE}); a cell that failed the check has no timing.")
    if floors := [f for f in FLOORS if f in results["targets"]]:
        check += f" `{'`, `'.join(floors)}` answers zeros: only its row counts were checked."
    lines += ["", check + " `ours vs peer` > 1 means ours is better (peer ms / our ms, or our emb/s / peer emb/s).",
              ""]
    return "\n".join(lines + scenario_tables(results)) + "\n"


def _cells_table(results: dict) -> list[str]:
    names = [n for n in _targets(results) if n not in FLOORS]
    lines = ["| cell | metric | " + " | ".join(names) + " |", "|---" * (2 + len(names)) + "|"]
    for cell in results["cells"]:
        ours, metric = cell["results"].get(OURS, {}), cell["metric"]
        values = []
        for name in names:
            r = cell["results"].get(name, {})
            ratio = speedup(cell, ours, r) if name != OURS else None
            values.append("-" if metric not in r else f"{r[metric]:.1f}" + (f" ({ratio:.2f}x)" if ratio else ""))
        lines.append(f"| {cell['label']} | {'p50 ms' if metric == 'p50_ms' else 'emb/s'} | " + " | ".join(values) + " |")
    return lines


def readme_table(results_dir: Path, repo: Path) -> str:
    """The README's performance section body: each profile's current result file, from the machine that ran
    it last (each machine's folder keeps its own; the README shows one of each, newest by date)."""
    newest: dict[str, tuple[str, Path, dict]] = {}
    for folder in sorted(p for p in results_dir.iterdir() if p.is_dir()):
        for profile in README_PROFILES:
            path = folder / f"{profile}.json"
            if path.is_file():
                results = json.loads(path.read_text())
                if profile not in newest or results["machine"]["date"] > newest[profile][0]:
                    newest[profile] = (results["machine"]["date"], path, results)
    lines = []
    for profile in (p for p in README_PROFILES if p in newest):
        _, path, results = newest[profile]
        m, link = results["machine"], path.with_suffix(".md").relative_to(repo)
        isa = vector_isa(m)
        gpu = f", {m['gpu']}" if m.get("gpu") else f"{', ' + isa if isa else ''}, no GPU"
        lines += [f"**`{profile}`** on {m['cpu']} ({m['cores']} cores{gpu}), {m['date']}, "
                  f"{results['model'].get('name', 'near-free model')}: [{link.name}]({link})", ""]
        lines += _cells_table(results)
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def write_readme_table(readme: Path, table: str) -> None:
    text = readme.read_text()
    head, rest = text.split(README_BEGIN, 1)
    readme.write_text(f"{head}{README_BEGIN}\n{table}{README_END}{rest.split(README_END, 1)[1]}")
