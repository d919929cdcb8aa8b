"""Scrape the encoder's rose_* samples off a server's /metrics endpoint."""
from __future__ import annotations

import urllib.request


def scrape(server) -> tuple[str, dict[str, float]]:
    body = urllib.request.urlopen(server.metrics_url, timeout=5).read().decode()
    samples = {}
    for line in body.splitlines():
        if line.startswith("rose_"):
            key, value = line.rsplit(" ", 1)
            samples[key] = float(value)
    return body, samples


def sample(samples, name, **labels):
    """The value of `name` whose labels include `labels` (model/version labels aside)."""
    matches = [v for k, v in samples.items() if k.split("{")[0] == name
               and all(f'{label}="{value}"' in k for label, value in labels.items())]
    assert len(matches) == 1, (name, labels, matches)
    return matches[0]
