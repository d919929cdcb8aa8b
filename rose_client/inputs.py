"""Read a bulk job: a text file (one text per line) or JSONL (one object per line)."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass


@dataclass
class BulkInput:
    texts: list[str]
    ids: list[str]
    sha256: str  # of the file's bytes: a resumed job must read the same input


def detect_format(path: str) -> str:
    return "jsonl" if path.endswith((".jsonl", ".ndjson")) else "text"


def read_input(path: str, fmt: str = "auto", text_field: str = "text", id_field: str = "id") -> BulkInput:
    """Text: every line is one text and its id is its 0-based line number.
    JSONL: `text_field` holds the text, `id_field` (optional) the id."""
    fmt = detect_format(path) if fmt == "auto" else fmt
    if fmt not in ("text", "jsonl"):
        raise ValueError(f"input format must be text, jsonl or auto, got {fmt!r}")
    with open(path, "rb") as f:
        data = f.read()
    lines = data.decode("utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    texts, ids = [], []
    for number, line in enumerate(lines, start=1):
        line = line.rstrip("\r")
        if fmt == "text":
            text, row_id = line, str(number - 1)
        else:
            text, row_id = _parse_json_line(path, number, line, text_field, id_field, len(texts))
        if not text.strip():
            raise ValueError(f"{path}:{number}: empty text")
        texts.append(text)
        ids.append(row_id)
    return BulkInput(texts, ids, hashlib.sha256(data).hexdigest())


def _parse_json_line(path: str, number: int, line: str, text_field: str, id_field: str,
                     row: int) -> tuple[str, str]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{number}: not JSON ({exc.msg})") from None
    if not isinstance(record, dict) or not isinstance(record.get(text_field), str):
        raise ValueError(f"{path}:{number}: expected an object with a string field {text_field!r}")
    return record[text_field], str(record.get(id_field, row))
