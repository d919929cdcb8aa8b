"""A batch's lines: the input file's requests (`read_requests`; a line that is not a request is
a `Line` with its `error`), the output and error files' lines (`result_line`, `error_line`), and
which input lines a file of results already holds (`done_lines`, for a resumed job).

A result's `id` carries its input line's number (`batch_req_<batch>_<line>`): a resumed job
skips the lines its files hold, so each request is answered exactly once."""
from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import orjson

METHOD = "POST"
LINE_FIELDS = {"custom_id", "method", "url", "body"}


@dataclass(frozen=True)
class Line:
    number: int                 # 1-based, in the input file (blank lines are skipped, not counted)
    custom_id: str | None
    body: bytes | None          # the request's JSON body, when the line is a request
    error: tuple[str, str] | None = None  # (code, message) when it is not


def _check(number: int, raw: bytes, endpoint: str, max_body_bytes: int, seen: set[str]) -> Line:
    try:
        parsed = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return Line(number, None, None, ("invalid_json", f"line {number} is not valid JSON: {exc}"))
    if not isinstance(parsed, dict):
        return Line(number, None, None, ("invalid_request", f"line {number} must be a JSON object"))
    custom_id = parsed.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return Line(number, None, None, ("missing_custom_id", f"line {number}: 'custom_id' is required and must "
                                                               "be a non-empty string"))
    if custom_id in seen:
        return Line(number, custom_id, None, ("duplicate_custom_id", f"line {number}: custom_id {custom_id!r} is "
                                                                      "used by an earlier line"))
    seen.add(custom_id)
    unknown = sorted(set(parsed) - LINE_FIELDS)
    if unknown:
        return Line(number, custom_id, None, ("invalid_request", f"line {number}: unknown field(s) {unknown}; "
                                                                  f"known: {sorted(LINE_FIELDS)}"))
    if parsed.get("method") != METHOD:
        return Line(number, custom_id, None, ("invalid_method", f"line {number}: 'method' must be {METHOD!r}, "
                                                                 f"got {parsed.get('method')!r}"))
    if parsed.get("url") != endpoint:
        return Line(number, custom_id, None, ("invalid_url", f"line {number}: 'url' must be the batch's endpoint "
                                                              f"{endpoint!r}, got {parsed.get('url')!r}"))
    if not isinstance(parsed.get("body"), dict):
        return Line(number, custom_id, None, ("invalid_body", f"line {number}: 'body' must be a JSON object"))
    body = orjson.dumps(parsed["body"])
    if len(body) > max_body_bytes:
        return Line(number, custom_id, None, ("request_too_large", f"line {number}: its body is {len(body)} bytes; "
                                                                    f"a request is at most {max_body_bytes}"))
    return Line(number, custom_id, body)


def read_requests(path: Path, endpoint: str, max_body_bytes: int) -> Iterator[Line]:
    """The input file's lines in order, each a request or an error; the same every time it is read."""
    seen: set[str] = set()
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            if raw.strip():
                yield _check(number, raw, endpoint, max_body_bytes, seen)


def result_id(batch_id: str, number: int) -> str:
    return f"batch_req_{batch_id.removeprefix('batch_')}_{number}"


def line_number(result: dict) -> int:
    return int(str(result["id"]).rsplit("_", 1)[1])


def result_line(batch_id: str, line: Line, status: int, body: bytes) -> bytes:
    """An answered request (the body as the endpoint answered it, an error's too)."""
    head = orjson.dumps({"id": result_id(batch_id, line.number), "custom_id": line.custom_id})
    response = b'{"status_code":%d,"request_id":"req_%s","body":%s}' % (status, secrets.token_hex(12).encode(), body)
    return head[:-1] + b',"response":' + response + b',"error":null}\n'


def error_line(batch_id: str, line: Line) -> bytes:
    """A line that is not a request: no response, its error."""
    code, message = line.error
    return orjson.dumps({"id": result_id(batch_id, line.number), "custom_id": line.custom_id, "response": None,
                         "error": {"code": code, "message": message}}) + b"\n"


def done_lines(path: Path) -> set[int]:
    """The input line numbers a results file holds; a last line cut short (the writer died in it)
    is removed from the file."""
    if not path.exists():
        return set()
    data = path.read_bytes()
    whole = data[:data.rfind(b"\n") + 1]
    if len(whole) != len(data):
        with open(path, "r+b") as f:
            f.truncate(len(whole))
            os.fsync(f.fileno())
    return {line_number(orjson.loads(raw)) for raw in whole.splitlines() if raw.strip()}
