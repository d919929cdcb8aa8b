"""Restart a tritonserver whose Python model stub died or hangs (standard library and rose_wire only).

Triton 2.51 neither restarts a dead Python-backend stub nor marks the server
or model unready: every new request fails with "Stub process '<model>' is not
healthy" and requests in flight in a decoupled model hang. A stub that hangs
while Triton still answers its health pings is no better. serve.sh runs this
next to the server; every `--interval` s it sends one tiny real request to each
served model at once (`ensemble`, `embed`; with a reranker also `rerank`,
`score`; with `--models-file`, the ensemble and unary front of every model served
by name). It stops the server when an answer names an unhealthy stub, or when
one model's probes get no answer within `--timeout` s `--max-timeouts` times in
a row while its encoder answers nothing else either (a busy encoder is not a
hung one: its `rose_requests_total` on `--metrics-url` moves). Probes reach whichever
instance Triton picks, so beside them it watches every model instance's stub process
(recorded once the server is ready): one that exited, or is stopped (SIGSTOP) at two
checks in a row, stops the server too, whichever instance it is. Stopping means
SIGTERM, then after `--grace` s SIGKILL to the server and every process below
it that is still there (model stubs included: a SIGSTOPped stub acts on nothing
else), so no process of the old server is left; it then exits with RESTART,
which tells serve.sh to start a fresh server. Answered errors (overload, bad
input) and refused connections (not listening yet) are not faults. Test-only pause
(`watchdog.pause` in the ROSE_TEST_FAULTS folder, testing/hold.py): while that file exists it
sends no probe (it still watches the stubs) and writes the file's token to `<file>.ack`
between rounds, so a test knows none of its probes is still queued when it holds the server's work.
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
PAUSE_FILE_NAME = "watchdog.pause"  # in the ROSE_TEST_FAULTS folder (testing/hold.py writes it)
# Probe outcomes: an answer (OK or an error), a dead stub, no answer in time, no connection.
OK, ANSWERED_ERROR, DEAD, TIMEOUT, UNREACHABLE = "ok", "error", "dead stub", "timeout", "unreachable"

TEXT = {"TEXT": ["watchdog probe"]}
PAIR = {"QUERY": ["watchdog probe"], "DOCUMENTS": ["watchdog probe"]}
# Every model that takes requests: its probe body (HTTP generate) and the encoder behind it.
PROBES = {"ensemble": TEXT, "embed": TEXT, "embed_batched": TEXT, "rerank": PAIR, "score": PAIR}
ENCODER_OF = {"ensemble": "rose_encoder", "embed": "rose_encoder", "embed_batched": "rose_encoder",
              "rerank": "rerank_encoder", "score": "rerank_encoder"}
RERANK_MODELS = ("rerank", "score")
ENCODER_OF_DEFAULT = dict(ENCODER_OF)
STUB = "triton_python_backend_stub"
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
    """Every model instance's stub process, recorded once the server is ready (Triton starts and
    ends stubs of its own while it loads models). `verdict` names an instance whose stub exited,
    or was stopped at this check and the one before (a moment's stop by a debugger is no fault)."""

    def __init__(self):
        self.known: dict[int, tuple[int, str]] | None = None  # pid -> (start time, instance)
        self.stopped: set[int] = set()

    def record(self, stubs: dict[int, tuple[int, str, str]]) -> None:
        self.known = {pid: (start, name) for pid, (start, _, name) in stubs.items()}

    def verdict(self, stubs: dict[int, tuple[int, str, str]]) -> str:
        """`stubs`: {pid: (start time, state letter, instance)} now -> '' or why to restart."""
        if self.known is None:
            return ""
        stopped = set()
        for pid, (start, name) in self.known.items():
            now = stubs.get(pid)
            if now is None or now[0] != start or now[1] == "Z":
                return f"{name}: its stub process {pid} exited"
            if now[1] == "T":
                if pid in self.stopped:
                    return f"{name}: its stub process {pid} is stopped"
                stopped.add(pid)
        self.stopped = stopped
        return ""


def stub_processes(server_pid: int) -> dict[int, tuple[int, str, str]]:
    """{pid: (start time, state letter, instance name)} of the Python-backend stubs below the
    server. The stub's command line is `<stub> <model.py> <shm region> ... <instance> <model dir>`."""
    found = {}
    for pid in descendants(server_pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                words = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if not words[0].endswith(STUB) or (stat := proc_stat(pid)) is None:
            continue
        name = words[-3] if len(words) >= 4 else words[1]
        found[pid] = (stat[2], stat[1], name)
    return found


def server_ready(url: str, timeout: float) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=timeout) as response:
            return response.status == 200
    except OSError:
        return False


def pause_token(pause_file: str) -> str | None:
    """The test-only pause file's token, or None when there is no pause."""
    try:
        with open(pause_file, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None


def acknowledge(pause_file: str, token: str) -> None:
    ack = f"{pause_file}.ack"
    with open(f"{ack}.tmp", "w", encoding="utf-8") as f:
        f.write(token)
    os.replace(f"{ack}.tmp", ack)


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


def sleep_while_alive(pid: int, seconds: float, wake=lambda: False) -> bool:
    """Sleep `seconds` or until `wake()` -> whether `pid` still runs."""
    deadline = time.monotonic() + seconds
    while running(pid) and time.monotonic() < deadline and not wake():
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
    judge = Judge(models, args.max_timeouts)
    stubs = StubWatch()
    faults_folder = os.environ.get("ROSE_TEST_FAULTS", "")  # test-only, as the models' (rose_triton/faults.py)
    pause_file = os.path.join(faults_folder, PAUSE_FILE_NAME) if faults_folder else ""
    acknowledged = None
    new_pause = (lambda: pause_token(pause_file) not in (None, acknowledged)) if pause_file else (lambda: False)
    with ThreadPoolExecutor(len(models), thread_name_prefix="probe") as pool:
        while sleep_while_alive(args.pid, args.interval, new_pause):
            if stubs.known is None and server_ready(args.url, args.timeout):
                stubs.record(stub_processes(args.pid))
            reason = stubs.verdict(stub_processes(args.pid))
            if not reason:
                if pause_file and (token := pause_token(pause_file)) is not None:
                    if token != acknowledged:
                        acknowledge(pause_file, token)
                        acknowledged = token
                    continue
                outcomes, busy = probe_round(pool, args.url, models, args.timeout, args.metrics_url)
                reason = judge.verdict(outcomes, busy)
            if reason and running(args.pid):
                say(f"{reason}; stopping tritonserver {args.pid} and every process below it")
                left = stop(args.pid, args.grace)
                if left:
                    say(f"WARNING: processes {left} of the old server are still there after SIGKILL")
                return RESTART
    # The server died by itself (serve.sh decides whether to start another): its stubs outlive
    # it, reparented, and a stopped one would keep its memory for good.
    # Each ends by itself once it sees its parent gone (and frees its shared memory) unless stopped.
    left = {pid: start for pid, (start, _) in (stubs.known or {}).items()}
    for pid in wait_gone(left, 5.0):
        if running(pid, left[pid]):
            send(pid, signal.SIGKILL)
    wait_gone(left, 10.0)  # a signal is delivered after kill() returns
    return 0


if __name__ == "__main__":
    sys.exit(main())
