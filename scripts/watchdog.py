"""Restart a tritonserver whose Python model stub died or hangs (standard library and rose_wire only).

Triton 2.51 neither restarts a dead Python-backend stub nor marks the server
or model unready: every new request fails with "Stub process '<model>' is not
healthy" and requests in flight in a decoupled model hang. A stub that hangs
while Triton still answers its health pings is no better. serve.sh runs this
next to the server; every `--interval` s it sends one tiny real request to each
served model at once (`ensemble`, `embed`; with a reranker also `rerank`,
`score`; with `--models-file`, the ensemble and unary front of every model served
by name). It stops the server when an answer names an unhealthy stub, when a
model stub process of the server ends while the server says it is ready (a
probe sees a dead instance only if it lands on it: under load the model's other
instances take nearly every request), or when one model's probes get no answer
within `--timeout` s `--max-timeouts` times in a row while its encoder answers
nothing else either (a busy encoder is not a hung one: its `rose_requests_total`
on `--metrics-url` moves). Stopping means
SIGTERM, then after `--grace` s SIGKILL to the server and every process below
it that is still there (model stubs included: a SIGSTOPped stub acts on nothing
else), so no process of the old server is left; it then exits with RESTART,
which tells serve.sh to start a fresh server. Answered errors (overload, bad
input) and refused connections (not listening yet) are not faults. While a test
holds the encoder or the tokenizer (ROSE_TEST_HOLD_FILE or ROSE_TEST_TOKENIZE_HOLD_FILE
exists, docs/operations.md) it does not probe: a held probe would wait and add to the
queue the test counts.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from rose_wire.names import EMBEDDER, RERANKER
from rose_wire.names import served_models as triton_names

RESTART = 3
DEAD_STUB = "is not healthy"
# Probe outcomes: an answer (OK or an error), a dead stub, no answer in time, no connection.
OK, ANSWERED_ERROR, DEAD, TIMEOUT, UNREACHABLE = "ok", "error", "dead stub", "timeout", "unreachable"

TEXT = {"TEXT": ["watchdog probe"]}
PAIR = {"QUERY": ["watchdog probe"], "DOCUMENTS": ["watchdog probe"]}
# Every model that takes requests: its probe body (HTTP generate) and the encoder behind it.
PROBES = {"ensemble": TEXT, "embed": TEXT, "rerank": PAIR, "score": PAIR}
ENCODER_OF = {"ensemble": "rose_encoder", "embed": "rose_encoder", "rerank": "rerank_encoder",
              "score": "rerank_encoder"}
RERANK_MODELS = ("rerank", "score")
ENCODER_OF_DEFAULT = dict(ENCODER_OF)
ANSWERS = re.compile(r'^rose_requests_total\{[^}]*model="([^"]+)"[^}]*\} (\S+)$', re.MULTILINE)


def served_models(rerank: bool, named: list[str] = ()) -> list[str]:
    return [m for m in PROBES if (rerank or m not in RERANK_MODELS) and (m in ENCODER_OF_DEFAULT or m in named)]


def named_targets(models_file: str) -> tuple[dict[str, dict], dict[str, str]]:
    """The models served by name (a models file: the launcher's served_models.json) ->
    ({model: probe body}, {model: its encoder}) for each one's ensemble and unary front."""
    with open(models_file, encoding="utf-8") as f:
        document = json.load(f)
    probes, encoders = {}, {}
    for section, kind, body in (("embedders", EMBEDDER, TEXT), ("rerankers", RERANKER, PAIR)):
        for name in document.get(section) or {}:
            models = triton_names(name, kind)
            for model in (models.ensemble, models.front):
                probes[model], encoders[model] = body, models.encoder
    return probes, encoders


def probe(url: str, model: str, timeout: float, body: dict | None = None) -> tuple[str, str]:
    """One tiny `generate` request to `model` (`body`, default its PROBES entry) -> (outcome, detail)."""
    body = PROBES[model] if body is None else body
    request = urllib.request.Request(f"{url}/v2/models/{model}/generate", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read()
        return OK, ""
    except urllib.error.HTTPError as exc:
        try:
            text = exc.read().decode(errors="replace")
        except OSError as read_error:
            text = str(read_error)
        return (DEAD if DEAD_STUB in text else ANSWERED_ERROR), text.strip()
    except OSError as exc:  # URLError wraps connect-time failures in .reason
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, (TimeoutError, socket.timeout)):
            return TIMEOUT, f"no answer within {timeout:g} s"
        return UNREACHABLE, str(reason)


def encoder_answers(metrics_url: str | None, timeout: float) -> dict[str, float] | None:
    """{encoder model: requests it answered so far} from the metrics page; None when unknown."""
    if not metrics_url:
        return None
    try:
        with urllib.request.urlopen(metrics_url, timeout=timeout) as response:
            page = response.read().decode(errors="replace")
    except OSError:
        return None
    answered: dict[str, float] = {}
    for model, value in ANSWERS.findall(page):
        answered[model] = answered.get(model, 0.0) + float(value)
    return answered


class Judge:
    """Decides after each round of probes whether the server must restart: at once for a
    dead stub; after `max_timeouts` timeouts in a row of one model whose encoder answered
    nothing else meanwhile. An answer (even an error) resets the model's count; a refused
    connection leaves it as it is."""

    def __init__(self, models: list[str], max_timeouts: int):
        if max_timeouts < 1:
            raise ValueError("max_timeouts must be >= 1")
        self.max_timeouts = max_timeouts
        self.timeouts = dict.fromkeys(models, 0)

    def verdict(self, outcomes: dict[str, tuple[str, str]], busy: set[str] = frozenset()) -> str:
        """'' to keep the server, else why to restart it. `busy`: the probed models whose
        encoder answered other requests during the round (their timeouts are queueing)."""
        for model, (outcome, detail) in outcomes.items():
            if outcome == DEAD:
                return f"{model}: {detail}"
            if outcome == TIMEOUT:
                self.timeouts[model] = 0 if model in busy else self.timeouts[model] + 1
            elif outcome != UNREACHABLE:
                self.timeouts[model] = 0
        hung = [m for m, count in self.timeouts.items() if count >= self.max_timeouts]
        if hung:
            return (f"{', '.join(hung)}: {self.max_timeouts} probe(s) in a row got no answer while the encoder "
                    f"answered nothing else (a hung model process)")
        return ""


def busy_models(models: list[str], before: dict | None, after: dict | None,
                encoder_of: dict[str, str] = ENCODER_OF) -> set[str]:
    if before is None or after is None:
        return set()
    return {m for m in models if after.get(encoder_of[m], 0.0) > before.get(encoder_of[m], 0.0)}


def probe_round(pool: ThreadPoolExecutor, url: str, models: list[str], timeout: float,
                metrics_url: str | None = None, probe_one=probe) -> tuple[dict, set]:
    """Probe every model at once -> ({model: (outcome, detail)}, busy models)."""
    before = encoder_answers(metrics_url, timeout)
    outcomes = dict(zip(models, pool.map(lambda m: probe_one(url, m, timeout), models)))
    return outcomes, busy_models(models, before, encoder_answers(metrics_url, timeout))


class StubWatch:
    """The server's model stub processes, read once it is ready (stubs that only check a model's
    config come and go while it loads). `verdict` names the stubs that ended since, if the server
    still says it is ready: a stopping server is not ready, and its stubs end as they should."""

    def __init__(self):
        self.stubs: dict[int, tuple[int, str]] = {}  # pid -> (start time, model instance)

    def verdict(self, server_pid: int, ready) -> str:
        gone = [f"{name} (pid {pid})" for pid, (start, name) in self.stubs.items() if not running(pid, start)]
        if gone:
            return f"model process {', '.join(gone)} ended while the server was ready" if ready() else ""
        if not self.stubs and ready():
            self.stubs = stub_processes(server_pid)
        return ""


def stub_processes(pid: int) -> dict[int, tuple[int, str]]:
    """{pid: (start time, model instance)} of the Python backend stubs below `pid`."""
    found = {}
    for child, start in descendants(pid).items():
        try:
            with open(f"/proc/{child}/cmdline", "rb") as f:
                args = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if args and args[0].endswith("triton_python_backend_stub"):
            found[child] = (start, args[-3] if len(args) >= 3 else "?")  # ... NAME KIND, then a trailing ""
    return found


def server_ready(url: str, timeout: float) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=timeout) as response:
            return response.status == 200
    except OSError:
        return False


def proc_stat(pid: int) -> tuple[int, str, int] | None:
    """(parent pid, state letter, start time in clock ticks) from /proc, or None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), fields[0], int(fields[19])


def descendants(pid: int) -> dict[int, int]:
    """{pid: start time} of every process below `pid`."""
    parent_of = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := proc_stat(int(entry))) is not None:
            parent_of[int(entry)] = (stat[0], stat[2])
    found: dict[int, int] = {}
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        for child, (ppid, start) in parent_of.items():
            if ppid == parent and child not in found:
                found[child] = start
                frontier.append(child)
    return found


def running(pid: int, start: int | None = None) -> bool:
    """`pid` exists and is no zombie (and, given `start`, is the process that started then)."""
    stat = proc_stat(pid)
    return stat is not None and stat[1] != "Z" and (start is None or stat[2] == start)


def send(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def wait_gone(tree: dict[int, int], seconds: float) -> list[int]:
    """Poll until no process of `tree` runs or `seconds` pass -> those still running."""
    deadline = time.monotonic() + seconds
    while (left := [p for p, start in tree.items() if running(p, start)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def stop(pid: int, grace: float) -> list[int]:
    """SIGTERM `pid`; after `grace` s SIGKILL it and every process that was below it and still runs.
    -> pids still running after that (none expected). The tree is read before the server dies:
    its children are reparented then."""
    stat = proc_stat(pid)
    tree = {pid: stat[2]} if stat is not None else {}
    tree.update(descendants(pid))
    send(pid, signal.SIGTERM)
    if wait_gone(tree, grace):
        if running(pid):
            tree.update(descendants(pid))
        for member, start in tree.items():
            if running(member, start):
                send(member, signal.SIGKILL)  # also ends a stopped process
    return wait_gone(tree, 10.0)


def sleep_while_alive(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    return running(pid)


def say(message: str) -> None:
    print(f"[watchdog] {time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pid", type=int, required=True, help="tritonserver process id")
    parser.add_argument("--url", required=True, help="HTTP base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--metrics-url", help="Triton's metrics page, e.g. http://127.0.0.1:8002/metrics")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between rounds of probes")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds a probe waits for its answer")
    parser.add_argument("--max-timeouts", type=int, default=3, help="timeouts in a row of one model that restart")
    parser.add_argument("--grace", type=float, default=2.0, help="SIGTERM to SIGKILL")
    parser.add_argument("--probe-rerank", action="store_true", help="also probe `rerank` and `score`")
    parser.add_argument("--models-file", help="also probe the models served by name this models file lists")
    args = parser.parse_args(argv)
    named: list[str] = []
    if args.models_file:
        probes, encoders = named_targets(args.models_file)
        PROBES.update(probes)
        ENCODER_OF.update(encoders)
        named = list(probes)
    models = served_models(args.probe_rerank, named)
    judge, stubs = Judge(models, args.max_timeouts), StubWatch()
    hold_files = [f for f in map(os.environ.get, ("ROSE_TEST_HOLD_FILE", "ROSE_TEST_TOKENIZE_HOLD_FILE")) if f]
    with ThreadPoolExecutor(len(models), thread_name_prefix="probe") as pool:
        while sleep_while_alive(args.pid, args.interval):
            if any(map(os.path.exists, hold_files)):
                continue
            reason = stubs.verdict(args.pid, lambda: server_ready(args.url, args.timeout))
            if not reason:
                outcomes, busy = probe_round(pool, args.url, models, args.timeout, args.metrics_url)
                reason = judge.verdict(outcomes, busy)
            if reason and running(args.pid):
                say(f"{reason}; stopping tritonserver {args.pid} and every process below it")
                left = stop(args.pid, args.grace)
                if left:
                    say(f"WARNING: processes {left} of the old server are still there after SIGKILL")
                return RESTART
    return 0


if __name__ == "__main__":
    sys.exit(main())
