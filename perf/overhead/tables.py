"""Overhead results -> markdown table lines (per path, load, hops); perf/report.py renders the document."""
from __future__ import annotations

HOPS = ("wait", "form", "compute", "respond")
HOP_NAMES = {"wait": "execute entry -> picked into a batch", "form": "picked -> launched",
             "compute": "launched -> result ready", "respond": "result ready -> response sent"}


def _f(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _cpu(result) -> float | None:
    return result["server_cpu_ms_per_request"] if result else None


def _ratio(new, old) -> str:
    return f"{old / new:.2f}x" if new and old else "-"


def path_table(results: dict) -> list[str]:
    variants, inproc = results["variants"], results["inproc"]
    compare = variants[1:]
    head = ("| path | server | served p50 / p99 ms | model ms | overhead p50 / p99 ms | server CPU ms/req "
            "| client CPU ms/req |" + "".join(f" current vs {c}: overhead p50, server CPU |" for c in compare))
    lines = [head, "|---" * (7 + len(compare)) + "|"]
    for path, by_variant in results["paths"].items():
        for name in variants:
            r = by_variant.get(name)
            if r is None:
                continue
            ratios = "".join(f" {_ratio(r['overhead_p50_ms'], by_variant.get(c, {}).get('overhead_p50_ms'))}, "
                             f"{_ratio(r['server_cpu_ms_per_request'], _cpu(by_variant.get(c)))} |"
                             if name == "current" else " |" for c in compare)
            lines.append(f"| `{path}` | {name} | {_f(r['p50_ms'])} / {_f(r['p99_ms'])} | {_f(r['model_ms'])} | "
                         f"{_f(r['overhead_p50_ms'])} / {_f(r['overhead_p99_ms'])} | "
                         f"{_f(r['server_cpu_ms_per_request'])} | {_f(r['client_cpu_ms_per_request'])} |{ratios}")
    step, tok, svc = (inproc[k] for k in ("engine_step", "tokenizer", "service"))
    one = inproc.get("engine_step_1_thread")
    lines += ["", f"In-process, same model, this process ({inproc['torch_threads']} torch threads), p50 / p99 ms: "
              f"`ModelRunner.step` {_f(step['p50_ms'], 3)} / {_f(step['p99_ms'], 3)}"
              + (f" (on 1 thread {_f(one['p50_ms'], 3)} / {_f(one['p99_ms'], 3)})" if one else "")
              + "; tokenizer (decode + encode) "
              f"{_f(tok['p50_ms'], 3)} / {_f(tok['p99_ms'], 3)}; `BatchingService` submit -> callback (its threads, "
              f"no Triton) {_f(svc['p50_ms'], 3)} / {_f(svc['p99_ms'], 3)}.", ""]
    return lines


def load_table(results: dict) -> list[str]:
    variants = results["variants"]
    lines = ["| path | clients | server | requests/s | p50 / p99 ms | server CPU ms/req | vs padded (req/s, CPU) |"
             " current vs this (req/s, CPU) | machine busy before |", "|---" * 9 + "|"]
    padded = {c["concurrency"]: c["results"].get("current") for c in results.get("load", []) if c["path"] == "padded"}
    for cell in results.get("load", []):
        base = padded.get(cell["concurrency"])
        for name in variants:
            r = cell["results"].get(name)
            if r is None:
                continue
            vs = (f"{r['requests_per_s'] / base['requests_per_s']:.2f}x, "
                  f"{base['server_cpu_ms_per_request'] / r['server_cpu_ms_per_request']:.2f}x"
                  if base and cell["path"] != "padded" else "-")
            cur = cell["results"].get("current")
            mine = (f"{cur['requests_per_s'] / r['requests_per_s']:.2f}x, "
                    f"{r['server_cpu_ms_per_request'] / cur['server_cpu_ms_per_request']:.2f}x"
                    if cur and name != "current" else "-")
            lines.append(f"| `{cell['path']}` | {cell['concurrency']} | {name} | {r['requests_per_s']:.0f} | "
                         f"{_f(r['p50_ms'])} / {_f(r['p99_ms'])} | {_f(r['server_cpu_ms_per_request'])} | {vs} | "
                         f"{mine} | {r['machine_busy_before']:.0%} |")
    rounds = results["settings"].get("load_rounds", 1)
    return lines + ["", "`vs padded` > 1 means ours is better: more requests/s, less server CPU per request. Each "
                    f"cell: {rounds} window(s) of {results['settings']['load_seconds']:.0f} s per server in "
                    "alternating order, summed; p50/p99 are means over windows.", ""]


def hop_table(results: dict) -> list[str]:
    lines = ["| path | server | Triton per model: queue / compute_input / compute_infer / compute_output us "
             "| encoder: " + " / ".join(HOPS) + " us | server CPU ms/req by process |", "|---" * 5 + "|"]
    for path, by_variant in results["paths"].items():
        for name, r in by_variant.items():
            models = "; ".join(f"{m} " + " / ".join(_f(s.get(k + "_us"), 0) for k in
                                                     ("queue", "compute_input", "compute_infer", "compute_output"))
                               for m, s in r["triton_stats"].items())
            hop = r["encoder_hops_us"]
            hops = " / ".join(_f(hop.get(h), 0) for h in HOPS) if hop else "-"
            cpu = ", ".join(f"{k} {v:.2f}" for k, v in r["server_cpu_ms_by_process"].items())
            lines.append(f"| `{path}` | {name} | {models} | {hops} | {cpu} |")
    return lines + ["", "Endpoint hops: " + "; ".join(f"{h} = {d}" for h, d in HOP_NAMES.items()) + ". Triton "
                    "statistics are means per request over the timed windows (a decoupled model's compute_infer "
                    "is its `execute` call, not the request's life).", ""]


def readme_rows(results: dict) -> list[str]:
    """README rows: overhead and server CPU per path, the first compared server ("before") vs current."""
    before = next((v for v in results["variants"] if v != "current"), None)
    if before is None:
        lines = ["| path | overhead p50 ms | server CPU ms/req |", "|---|---|---|"]
        lines += [f"| `{p}` | {_f(r['current']['overhead_p50_ms'])} | "
                  f"{_f(r['current']['server_cpu_ms_per_request'])} |" for p, r in results["paths"].items()]
        return lines
    lines = [f"| path | overhead p50 ms, `{before}` -> now | ratio | server CPU ms/req, `{before}` -> now | ratio |",
             "|---|---|---|---|---|"]
    for path, by_variant in results["paths"].items():
        new, old = by_variant["current"], by_variant.get(before)
        if old is None:
            lines.append(f"| `{path}` | {_f(new['overhead_p50_ms'])} | - | {_f(_cpu(new))} | - |")
            continue
        lines.append(f"| `{path}` | {_f(old['overhead_p50_ms'])} -> {_f(new['overhead_p50_ms'])} | "
                     f"{_ratio(new['overhead_p50_ms'], old['overhead_p50_ms'])} | "
                     f"{_f(old['server_cpu_ms_per_request'])} -> {_f(new['server_cpu_ms_per_request'])} | "
                     f"{_ratio(new['server_cpu_ms_per_request'], old['server_cpu_ms_per_request'])} |")
    for cell in results.get("load", []):
        new, old = cell["results"].get("current"), cell["results"].get(before)
        if new and old:
            lines.append(f"| `{cell['path']}` x{cell['concurrency']} clients: requests/s | "
                         f"{old['requests_per_s']:.0f} -> {new['requests_per_s']:.0f} | "
                         f"{new['requests_per_s'] / old['requests_per_s']:.2f}x | "
                         f"{_f(old['server_cpu_ms_per_request'])} -> {_f(new['server_cpu_ms_per_request'])} | "
                         f"{_ratio(new['server_cpu_ms_per_request'], old['server_cpu_ms_per_request'])} |")
    return lines + ["", "Ratios > 1: now is better (less overhead, less CPU, more requests/s)."]
