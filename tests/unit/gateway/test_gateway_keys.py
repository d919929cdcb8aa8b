"""The keys file's checks (gateway/http/keys.py) and the counts' arithmetic (gateway/http/limits.py):
each refusal names what is wrong; the shared counters across two connections to one file."""
import hashlib
import os
import subprocess
import sys

import pytest

from gateway.http.keys import KeysFile, parse_keys
from gateway.http.limits import LimitReached, SharedCounters, rate_headers, reset_text

DIGEST = hashlib.sha256(b"k").hexdigest()


@pytest.mark.parametrize("document, named", [
    ({"key": {}}, "one field 'keys'"),
    ({"keys": {"a": {"sha256": "ab"}}}, "64 hex digits"),
    ({"keys": {"a": {"sha256": DIGEST, "rpm": 3}}}, "unknown field(s) ['rpm']"),
    ({"keys": {"a": {"sha256": DIGEST, "tokens_per_minute": 0}}}, "'tokens_per_minute' must be an integer >= 1"),
    ({"keys": {"a": {"sha256": DIGEST, "models": "m"}}}, "'models' must be a list"),
    ({"keys": {"a": {"sha256": DIGEST}, "b": {"sha256": DIGEST.upper()}}}, "same key as 'a'"),
])
def test_a_bad_keys_file_is_refused_naming_the_problem(document, named):
    with pytest.raises(ValueError) as error:
        parse_keys(document, "keys.json")
    assert named in str(error.value)


def test_a_yaml_keys_file_and_lookup_by_hash(tmp_path):
    path = tmp_path / "keys.yaml"
    path.write_text(f"keys:\n  team-a:\n    sha256: {DIGEST}\n    models: [m1]\n    requests_per_minute: 5\n")
    keys = KeysFile(str(path))
    entry = keys.lookup(b"k")
    assert (entry.name, entry.models, entry.requests_per_minute, entry.tokens_per_minute) == ("team-a", {"m1"}, 5, 0)
    assert keys.lookup(b"other") is None


@pytest.mark.parametrize("option, content, problem", [
    ("--keys-file", None, "No such file or directory"),
    ("--keys-file", "{not json", "is not valid JSON"),
    ("--keys-file", '{"keys": {"a": {"sha256": "ab"}}}', "key 'a': 'sha256' must be the 64 hex digits"),
    ("--api-key-file", None, "No such file or directory"),
])
def test_a_keys_file_missing_or_broken_stops_the_gateway_in_one_line(tmp_path, option, content, problem):
    path = tmp_path / "keys.json"
    if content is not None:
        path.write_text(content)
    started = subprocess.run([sys.executable, "-m", "gateway", "--triton", "127.0.0.1:1", option, str(path)],
                             capture_output=True, text=True, timeout=60, env={**os.environ, "ROSE_GATEWAY_DATA_DIR": ""})
    assert started.returncode == 1
    assert started.stderr.splitlines() == [started.stderr.strip()], started.stderr  # one line, no traceback
    assert started.stderr.startswith("gateway: ") and str(path) in started.stderr and problem in started.stderr


@pytest.mark.parametrize("seconds, text", [(0.0004, "0ms"), (0.25, "250ms"), (1, "1s"), (47.5, "47.5s"),
                                           (60, "1m0s"), (61.25, "1m1.25s")])
def test_reset_is_written_as_openai_writes_it(seconds, text):
    assert reset_text(seconds) == text


def test_counters_are_shared_through_the_file(tmp_path):
    (entry,) = parse_keys({"keys": {"a": {"sha256": DIGEST, "requests_per_minute": 2, "tokens_per_minute": 10,
                                          "concurrent_requests": 2}}}, "k").values()
    one, two = SharedCounters(str(tmp_path / "db")), SharedCounters(str(tmp_path / "db"))
    now = 600.0 + 30
    one.admit(entry, now)
    usage = two.admit(entry, now)
    assert rate_headers(entry, usage) == {
        "x-ratelimit-limit-requests": "2", "x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "30s",
        "x-ratelimit-limit-tokens": "10", "x-ratelimit-remaining-tokens": "10", "x-ratelimit-reset-tokens": "30s"}
    with pytest.raises(LimitReached) as refused:
        one.admit(entry, now)
    assert (refused.value.limit, refused.value.retry_after) == ("requests_per_minute", 30)
    one.charge(entry, 6, now)
    with pytest.raises(LimitReached) as refused:
        two.charge(entry, 5, now)
    assert refused.value.limit == "tokens_per_minute" and refused.value.usage.tokens == 6
    one.release(entry)
    assert two.admit(entry, now + 30).requests == 1  # the next minute; two's two requests in flight
    with pytest.raises(LimitReached) as refused:
        one.admit(entry, now + 31)
    assert (refused.value.limit, refused.value.retry_after) == ("concurrent_requests", 1)
    two.release(entry)
    assert one.admit(entry, now + 32).requests == 2
