"""scripts/watchdog.py: which probe outcomes restart the server (timeouts counted, every
served model probed), the probe against real sockets, the stub processes it watches (an
exited or stopped one restarts, whichever instance), the test-only pause, and a stop that
leaves no process of the old server behind (a SIGSTOPped child included)."""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rose_triton.parameters import pbtxt_parameters, read_model_config
from rose_triton.server import REPO
from testing.waiting import wait_until

spec = importlib.util.spec_from_file_location("watchdog", REPO / "scripts" / "watchdog.py")
watchdog = importlib.util.module_from_spec(spec)
spec.loader.exec_module(watchdog)

OK, ERROR, DEAD, TIMEOUT, UNREACHABLE = (watchdog.OK, watchdog.ANSWERED_ERROR, watchdog.DEAD, watchdog.TIMEOUT,
                                         watchdog.UNREACHABLE)
MODELS = watchdog.served_models(rerank=True)


def outcomes(**by_model):
    return {m: (by_model.get(m, OK), "") for m in MODELS}


def test_a_dead_stub_restarts_at_once_naming_it():
    judge = watchdog.Judge(MODELS, max_timeouts=3)
    reason = judge.verdict({**outcomes(), "embed": (DEAD, "Stub process 'embed_0' is not healthy")})
    assert reason == "embed: Stub process 'embed_0' is not healthy"


def test_timeouts_in_a_row_of_one_model_restart():
    judge = watchdog.Judge(MODELS, max_timeouts=3)
    assert judge.verdict(outcomes(score=TIMEOUT)) == ""
    assert judge.verdict(outcomes(score=TIMEOUT)) == ""
    assert judge.verdict(outcomes(score=TIMEOUT)).startswith("score: 3 probe(s) in a row got no answer")


@pytest.mark.parametrize("between, restarts", [(OK, False), (ERROR, False), (UNREACHABLE, True)])
def test_an_answer_resets_the_count_a_refused_connection_does_not(between, restarts):
    judge = watchdog.Judge(MODELS, max_timeouts=2)
    assert judge.verdict(outcomes(ensemble=TIMEOUT)) == ""
    assert judge.verdict(outcomes(ensemble=between)) == ""
    assert bool(judge.verdict(outcomes(ensemble=TIMEOUT))) == restarts


def test_timeouts_while_the_encoder_answers_other_requests_are_queueing_not_a_hang():
    judge = watchdog.Judge(MODELS, max_timeouts=1)
    assert judge.verdict(outcomes(ensemble=TIMEOUT, embed=TIMEOUT), busy={"ensemble", "embed"}) == ""
    assert judge.verdict(outcomes(ensemble=TIMEOUT), busy={"rerank", "score"}).startswith("ensemble:")


def test_busy_models_follow_their_encoders_answer_counts():
    before = {"rose_encoder": 10.0, "rerank_encoder": 4.0}
    assert watchdog.busy_models(MODELS, before, {"rose_encoder": 11.0, "rerank_encoder": 4.0}) == \
        {"ensemble", "embed", "embed_batched"}
    assert watchdog.busy_models(MODELS, before, None) == set()  # metrics unknown: every timeout counts


def test_every_served_model_is_probed_in_each_round():
    asked = []

    def probe_one(url, model, timeout):
        asked.append(model)
        return TIMEOUT, ""

    with ThreadPoolExecutor(4) as pool:
        found, busy = watchdog.probe_round(pool, "http://unused", MODELS, 1.0, probe_one=probe_one)
    assert sorted(asked) == sorted(MODELS) and set(found) == set(MODELS) and busy == set()
    assert watchdog.served_models(rerank=False) == ["ensemble", "embed", "embed_batched"]


def model_folders():
    for root in (REPO / "model_repository", REPO / "model_sets" / "rerank"):
        for folder in sorted(root.iterdir()):
            if (folder / "config.pbtxt").is_file():
                yield folder


def test_the_probes_cover_every_model_that_takes_requests_with_its_inputs():
    """Every ensemble and unary front of the shipped repository is probed with its inputs, and
    its encoder (whose answer count tells busy from hung) is the one the probe names."""
    entries = {}
    for folder in model_folders():
        config = read_model_config(str(folder / "config.pbtxt"))
        if config.platform == "ensemble":
            entries[folder.name] = ([i.name for i in config.input], config.ensemble_scheduling.step[-1].model_name)
        elif any(os.path.samefile(folder / "1" / "model.py", REPO / "model_repository" / front / "1" / "model.py")
                 for front in ("embed", "embed_batched")):
            encoder = pbtxt_parameters(str(folder / "config.pbtxt"))["encoder_model"]
            entries[folder.name] = ([i.name for i in config.input], encoder)
    assert set(entries) == set(watchdog.PROBES) == set(MODELS)
    for model, (inputs, encoder) in entries.items():
        assert sorted(watchdog.PROBES[model]) == sorted(inputs) and watchdog.ENCODER_OF[model] == encoder


def test_models_served_by_name_are_probed_through_their_ensemble_and_front(tmp_path):
    """--models-file (the launcher's served_models.json): each named model's ensemble and unary
    front, with its kind's inputs, judged busy by its own encoder's answers."""
    from rose_triton.models_file import ServedModel, to_document
    from rose_wire import EMBEDDER, RERANKER

    path = tmp_path / "served_models.json"
    path.write_text(json.dumps(to_document([ServedModel("e5", EMBEDDER, "/m"), ServedModel("judge", RERANKER, "/r")])))
    probes, encoders = watchdog.named_targets(str(path))
    assert probes == {"e5": watchdog.TEXT, "e5_embed": watchdog.TEXT, "judge": watchdog.PAIR,
                      "judge_score": watchdog.PAIR}
    assert encoders == {"e5": "e5_encoder", "e5_embed": "e5_encoder", "judge": "judge_encoder",
                        "judge_score": "judge_encoder"}
    before, after = {"e5_encoder": 1.0}, {"e5_encoder": 2.0, "judge_encoder": 0.0}
    assert watchdog.busy_models(list(probes), before, after, encoders) == {"e5", "e5_embed"}


class FakeTriton(BaseHTTPRequestHandler):
    """Answers a generate as `server.mode` says; GET serves `server.metrics`."""

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.server.posts += 1
        status, body = {"ok": (200, '{"EMBEDDINGS": [[1.0]]}'),
                        "dead": (400, '{"error":"Stub process \'rose_encoder_0_0\' is not healthy."}'),
                        "overloaded": (400, '{"error":"overloaded: encoder queue is full"}')}[self.server.mode]
        self.answer(status, body)

    def do_GET(self):
        self.answer(200, self.server.metrics)

    def answer(self, status, body):
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def fake_triton():
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeTriton)
    server.daemon_threads = True
    server.mode, server.metrics, server.posts = "ok", "", 0
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def silent_url():
    """Accepts connections (the kernel's backlog) and never answers: a hung server."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


def closed_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_probe_outcomes_over_real_sockets(fake_triton, silent_url):
    server, url = fake_triton
    for mode, expected in (("ok", OK), ("dead", DEAD), ("overloaded", ERROR)):
        server.mode = mode
        assert watchdog.probe(url, "ensemble", 5.0)[0] == expected, mode
    assert watchdog.probe(silent_url, "embed", 0.2) == (TIMEOUT, "no answer within 0.2 s")
    assert watchdog.probe(closed_url(), "embed", 5.0)[0] == UNREACHABLE


def test_encoder_answers_sum_every_outcome_per_encoder(fake_triton):
    server, url = fake_triton
    server.metrics = ('# TYPE rose_requests_total counter\n'
                      'rose_requests_total{model="rose_encoder",outcome="ok",version="1"} 7\n'
                      'rose_requests_total{model="rose_encoder",outcome="error",version="1"} 2\n'
                      'rose_requests_total{model="rerank_encoder",outcome="ok",version="1"} 1\n'
                      'nv_inference_count{model="rose_encoder",version="1"} 99\n')
    assert watchdog.encoder_answers(f"{url}/metrics", 5.0) == {"rose_encoder": 9.0, "rerank_encoder": 1.0}
    assert watchdog.encoder_answers(closed_url() + "/metrics", 5.0) is None


def tree_of_sleeps():
    """A 'server' (bash) with two children (sleep); -> (process, {child pid: start time})."""
    process = subprocess.Popen(["bash", "-c", "sleep 600 & sleep 600 & wait"])
    def started():
        found = watchdog.descendants(process.pid)
        return found if len(found) >= 2 else None

    children = wait_until(started, 10, "the children to start")
    return process, children


def clean_up(process, children):
    """Kill what a failed test left, checking each pid is still the process we started."""
    if process.poll() is None:
        process.kill()
    process.wait(10)
    for pid, start in children.items():
        if watchdog.running(pid, start):
            watchdog.send(pid, signal.SIGKILL)


def test_stop_leaves_no_process_of_the_tree_a_stopped_one_included():
    process, children = tree_of_sleeps()
    os.kill(next(iter(children)), signal.SIGSTOP)  # a stopped process acts on nothing but SIGKILL
    try:
        assert watchdog.stop(process.pid, grace=0.5) == []
        assert process.wait(10) is not None
        assert not any(watchdog.running(pid, start) for pid, start in children.items())
    finally:
        clean_up(process, children)


def test_a_hung_server_is_stopped_and_restart_is_asked(silent_url):
    process, children = tree_of_sleeps()
    try:
        verdict = watchdog.main(["--pid", str(process.pid), "--url", silent_url, "--interval", "0.05",
                                 "--timeout", "0.2", "--max-timeouts", "2", "--grace", "0.2"])
        assert verdict == watchdog.RESTART
        assert process.wait(10) is not None
        assert not any(watchdog.running(pid, start) for pid, start in children.items())
    finally:
        clean_up(process, children)


STUBS = {101: (5, "S", "embed_0_0"), 102: (6, "S", "embed_0_1"), 103: (7, "R", "tokenizer_0_0")}


def test_stubs_are_watched_once_recorded():
    watch = watchdog.StubWatch()
    assert watch.verdict({}) == ""  # not ready yet: Triton starts and ends stubs while it loads
    watch.record(STUBS)
    assert watch.verdict(STUBS) == ""
    assert watch.verdict({**STUBS, 104: (9, "S", "embed_0_2")}) == ""  # one it does not know is none of its


@pytest.mark.parametrize("now, reason", [
    ({101: STUBS[101], 103: STUBS[103]}, "embed_0_1: its stub process 102 exited"),
    ({**STUBS, 102: (8, "S", "embed_0_1")}, "embed_0_1: its stub process 102 exited"),  # its pid reused
    ({**STUBS, 102: (6, "Z", "embed_0_1")}, "embed_0_1: its stub process 102 exited"),
])
def test_a_stub_that_exited_restarts_whichever_instance_it_was(now, reason):
    watch = watchdog.StubWatch()
    watch.record(STUBS)
    assert watch.verdict(now) == reason


def test_a_stub_stopped_at_two_checks_in_a_row_restarts():
    watch = watchdog.StubWatch()
    watch.record(STUBS)
    stopped = {**STUBS, 103: (7, "T", "tokenizer_0_0")}
    assert watch.verdict(stopped) == ""
    assert watch.verdict(STUBS) == ""  # continued: the count starts again
    assert watch.verdict(stopped) == ""
    assert watch.verdict(stopped) == "tokenizer_0_0: its stub process 103 is stopped"


def fake_server_with_stubs(tmp_path, instances):
    """A 'server' (bash) whose children carry a Python-backend stub's command line, one per
    instance name -> (process, {child pid: start time})."""
    python = os.path.realpath(sys.executable)  # not a launcher script: one that re-executes loses the name
    stubs = " ".join(f"(exec -a {tmp_path}/{watchdog.STUB} {python} -c 'import time; time.sleep(600)' "
                     f"/m/embed/1/model.py region 1 2 3 libpython ipc {name} /m/embed) &" for name in instances)
    process = subprocess.Popen(["bash", "-c", f"{stubs} wait"])
    children = wait_until(lambda: (found := watchdog.stub_processes(process.pid)) and len(found) == len(instances)
                          and found, 10, "the stubs to start")
    return process, {pid: start for pid, (start, _, _) in children.items()}


def test_stub_processes_are_found_with_their_instance_names(tmp_path):
    process, children = fake_server_with_stubs(tmp_path, ["embed_0_0", "embed_0_1"])
    try:
        found = watchdog.stub_processes(process.pid)
        assert sorted(name for _, state, name in found.values()) == ["embed_0_0", "embed_0_1"]
    finally:
        clean_up(process, children)


def test_a_killed_stub_that_is_not_the_first_stops_the_server(tmp_path, fake_triton):
    server, url = fake_triton  # every probe answers: only the stub's process tells
    process, children = fake_server_with_stubs(tmp_path, ["embed_0_0", "embed_0_1", "embed_0_2"])
    verdict = {}
    thread = threading.Thread(target=lambda: verdict.setdefault("exit", watchdog.main(
        ["--pid", str(process.pid), "--url", url, "--interval", "0.05", "--grace", "0.2"])))
    try:
        thread.start()
        wait_until(lambda: server.posts >= 4, 30, "a round of probes (the stubs are recorded by then)")
        (victim,) = [pid for pid, (_, _, name) in watchdog.stub_processes(process.pid).items() if name == "embed_0_2"]
        os.kill(victim, signal.SIGKILL)
        thread.join(30)
        assert verdict == {"exit": watchdog.RESTART}
        assert process.wait(10) is not None
    finally:
        clean_up(process, children)


def test_paused_it_acknowledges_each_pause_and_sends_no_probe(tmp_path, fake_triton, monkeypatch):
    server, url = fake_triton
    pause = tmp_path / watchdog.PAUSE_FILE_NAME
    monkeypatch.setenv("ROSE_TEST_FAULTS", str(tmp_path))  # the server's fault gate folder
    process, children = tree_of_sleeps()
    thread = threading.Thread(target=watchdog.main, daemon=True,
                              args=(["--pid", str(process.pid), "--url", url, "--interval", "0.05"],))
    ack = tmp_path / "watchdog.pause.ack"
    try:
        thread.start()
        wait_until(lambda: server.posts >= 2, 30, "a round of probes")
        for token in ("first", "second"):
            pause.write_text(token)
            wait_until(lambda: ack.exists() and ack.read_text() == token, 30, f"the ack of {token}")
            posts = server.posts
            for _ in range(3):  # whole rounds of the loop pass without a probe
                pause.write_text(token + "-again")
                wait_until(lambda: ack.exists() and ack.read_text() == token + "-again", 30, "the ack")
                pause.write_text(token)
                wait_until(lambda: ack.read_text() == token, 30, "the ack")
            assert server.posts == posts
            pause.unlink()
            wait_until(lambda: server.posts > posts, 30, "probes again after the pause")
    finally:
        clean_up(process, children)
        thread.join(30)


def test_stubs_left_by_a_server_that_died_by_itself_are_ended(tmp_path, fake_triton):
    """A crashed server's stubs are reparented; one that is stopped would never see it and end."""
    server, url = fake_triton
    process, children = fake_server_with_stubs(tmp_path, ["embed_0_0", "embed_0_1"])
    verdict = {}
    thread = threading.Thread(target=lambda: verdict.setdefault("exit", watchdog.main(
        ["--pid", str(process.pid), "--url", url, "--interval", "0.05"])))
    try:
        thread.start()
        wait_until(lambda: server.posts >= 4, 30, "a round of probes (the stubs are recorded by then)")
        os.kill(next(iter(children)), signal.SIGSTOP)
        process.kill()  # the server dies by itself: no verdict of the watchdog's
        thread.join(60)
        assert verdict == {"exit": 0}
        assert not any(watchdog.running(pid, start) for pid, start in children.items())
    finally:
        clean_up(process, children)
