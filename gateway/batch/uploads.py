"""POST /v1/files' body: multipart/form-data (`file`, `purpose`, ...), received onto disk, never
whole in memory (`receive`), then split (`split_form`) and the file's lines counted (`count_lines`)."""
from __future__ import annotations

import mmap
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import bad_request, too_large

FORM_OVERHEAD = 64 << 10  # the form's own bytes past the file (boundaries, headers, small fields)
MAX_FIELD_BYTES = 4096    # a form field other than the file
COPY_BYTES = 1 << 20


@dataclass(frozen=True)
class Form:
    fields: dict[str, str]
    filename: str | None  # None: no `file` part
    file_bytes: int


async def receive(request, path: Path, max_bytes: int) -> int:
    """Write the request body to `path`; 413 past `max_bytes`. -> its size."""
    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > max_bytes:
        raise too_large(f"the upload is {declared} bytes; a file is at most {max_bytes - FORM_OVERHEAD}", "file")
    size = 0
    request.state.close_connection = True  # until the whole body is in: what is left of it is not read
    with open(path, "wb") as f:
        async for part in request.stream():
            size += len(part)
            if size > max_bytes:
                raise too_large(f"the upload is over {max_bytes} bytes; a file is at most "
                                f"{max_bytes - FORM_OVERHEAD}", "file")
            f.write(part)
    request.state.close_connection = False
    return size


def boundary_of(content_type: str) -> bytes:
    kind, _, params = content_type.partition(";")
    if kind.strip().lower() != "multipart/form-data":
        raise bad_request(f"send the file as multipart/form-data (fields `file` and `purpose`), got "
                          f"{kind.strip()!r}")
    found = re.search(r'boundary="?([^";]+)"?', params)
    if not found:
        raise bad_request("multipart/form-data without a boundary")
    return found.group(1).encode("latin-1")


def _disposition(headers: bytes) -> tuple[str | None, str | None]:
    """(name, filename) of a part's Content-Disposition."""
    for line in headers.split(b"\r\n"):
        key, _, value = line.partition(b":")
        if key.strip().lower() == b"content-disposition":
            text = value.decode("utf-8", "replace")
            name = re.search(r'(?:^|;)\s*name="([^"]*)"', text)
            filename = re.search(r'(?:^|;)\s*filename="([^"]*)"', text)
            return (name.group(1) if name else None), (filename.group(1) if filename else None)
    return None, None


def split_form(body: Path, content_type: str, file_dest: Path) -> Form:
    """The form in `body`: its small fields, and its `file` part copied to `file_dest`."""
    delimiter = b"--" + boundary_of(content_type)
    fields, filename, file_bytes = {}, None, 0
    if not body.stat().st_size:
        raise bad_request("the request has no body: send the form's `file` and `purpose`")
    with open(body, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        pos = data.find(delimiter)
        while pos >= 0:
            pos += len(delimiter)
            if data[pos:pos + 2] == b"--":
                break
            head_end = data.find(b"\r\n\r\n", pos)
            end = data.find(b"\r\n" + delimiter, head_end + 4) if head_end >= 0 else -1
            if end < 0:
                raise bad_request("the multipart/form-data body is cut short (a part without its end)")
            name, part_filename = _disposition(data[pos:head_end])
            start = head_end + 4
            if name == "file":
                filename, file_bytes = part_filename or "upload.jsonl", end - start
                with open(file_dest, "wb") as out:
                    for at in range(start, end, COPY_BYTES):
                        out.write(data[at:min(end, at + COPY_BYTES)])
            elif name:
                if end - start > MAX_FIELD_BYTES:
                    raise bad_request(f"form field {name!r} is over {MAX_FIELD_BYTES} bytes", name)
                fields[name] = data[start:end].decode("utf-8", "replace")
            pos = end + 2
    return Form(fields, filename, file_bytes)


def count_lines(path: Path) -> int:
    """The file's non-blank lines (a batch's requests); 400 if it is not UTF-8."""
    count = 0
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError:
                raise bad_request(f"line {number} of the file is not UTF-8", "file") from None
            count += bool(line.strip())
    return count
