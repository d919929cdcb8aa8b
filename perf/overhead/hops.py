"""Per-hop breakdown: Triton's per-model statistics and the encoder's own hop counters, as deltas."""
from __future__ import annotations

import json
import re
import urllib.request

STATS = ("queue", "compute_input", "compute_infer", "compute_output", "success")
HOP_LINE = re.compile(r'^rose_hop_seconds_total\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)', re.M)
OK_LINE = re.compile(r'^rose_requests_total\{(?P<labels>[^}]*outcome="ok"[^}]*)\}\s+(?P<value>\S+)', re.M)


def triton_stats(http_url: str, admin_key: str) -> dict:
    """{model: {stat: (count, ns)}, plus "executions"} from the statistics API (admin key needed)."""
    request = urllib.request.Request(f"http://{http_url}/v2/models/stats", headers={"rose-admin-key": admin_key})
    with urllib.request.urlopen(request, timeout=10) as response:
        body = json.load(response)
    out = {}
    for model in body.get("model_stats", []):
        stats = model.get("inference_stats", {})
        entry = {k: (int(stats.get(k, {}).get("count", 0)), int(stats.get(k, {}).get("ns", 0))) for k in STATS}
        entry["executions"] = (int(model.get("execution_count", 0)), 0)
        out[model["name"]] = entry
    return out


def triton_delta(after: dict, before: dict) -> dict:
    """{model: {stat: [count, ns]}} over a window, for the models that served anything in it."""
    out = {}
    for name, stats in after.items():
        old = before.get(name, {})
        delta = {k: [v[0] - old.get(k, (0, 0))[0], v[1] - old.get(k, (0, 0))[1]] for k, v in stats.items()}
        if delta["success"][0] or delta["executions"][0]:
            out[name] = delta
    return out


def triton_means(total: dict) -> dict:
    """Summed window deltas -> per model: requests, executions, mean microseconds per item of each stat."""
    return {name: {"requests": stats["success"][0], "executions": stats["executions"][0],
                   **{f"{k}_us": v[1] / v[0] / 1e3 for k, v in stats.items() if k in STATS and v[0] > 0}}
            for name, stats in total.items()}


def add(total: dict, delta: dict) -> dict:
    """Sum nested {key: number | [numbers] | dict} deltas into `total` (returned)."""
    for k, v in delta.items():
        if isinstance(v, dict):
            add(total.setdefault(k, {}), v)
        elif isinstance(v, list):
            total[k] = [a + b for a, b in zip(total.get(k, [0] * len(v)), v)]
        else:
            total[k] = total.get(k, 0) + v
    return total


def encoder_hops(metrics_url: str) -> dict:
    """{"ok": answered requests, hop: seconds} summed over the encoder's instances (empty if not exported)."""
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        text = response.read().decode()
    out: dict[str, float] = {}
    for match in HOP_LINE.finditer(text):
        hop = re.search(r'hop="([^"]+)"', match["labels"])
        if hop:
            out[hop[1]] = out.get(hop[1], 0.0) + float(match["value"])
    if out:
        out["ok"] = sum(float(m["value"]) for m in OK_LINE.finditer(text))
    return out


def hops_delta(after: dict, before: dict) -> dict:
    """Seconds per hop and answered requests over a window."""
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def hops_means(total: dict) -> dict:
    """Summed window deltas -> mean microseconds per answered request of each encoder hop."""
    requests = total.get("ok", 0.0)
    return {hop: value / requests * 1e6 for hop, value in total.items() if hop != "ok"} if requests else {}
