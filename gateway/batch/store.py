"""The Batch API's durable state: files and batch jobs in SQLite (WAL) under the data folder,
file contents beside it (`files/<id>`), a job's output while it runs in `work/<batch id>/`.

Times (created_at, expires_at, a file's or a job's expiry) come from the store's `clock`; leases
from the wall clock, which every process sharing the folder reads alike.

Every read and change names its owner (a hash of the API key, "" without keys): another
owner's id is 404, as an id that does not exist. Jobs are run under a lease (`claim`, `renew`):
one runner at a time per job across processes and machines sharing the folder; a runner that
stops renewing for `lease_s` loses it to the next `claim`, which takes the job over."""
from __future__ import annotations

import os
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import orjson

from ..errors import ApiError
from ..sqlite_wal import connect_shared, immediate

TERMINAL = ("completed", "failed", "expired", "cancelled")
RUNNABLE = ("validating", "in_progress", "finalizing", "cancelling")  # a runner takes these
CANCELLABLE = ("validating", "in_progress")
OUTPUT_PURPOSE = "batch_output"
STALE_UPLOAD_S = 24 * 3600

SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, purpose TEXT NOT NULL, expires_at INTEGER,
    body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS batches (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, status TEXT NOT NULL,
    lease_owner TEXT, lease_expires REAL NOT NULL DEFAULT 0, body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS files_by_owner ON files (owner);
CREATE INDEX IF NOT EXISTS batches_by_owner ON batches (owner);
CREATE INDEX IF NOT EXISTS batches_by_status ON batches (status);
"""


@dataclass(frozen=True)
class Limits:
    max_file_lines: int = 50_000        # an input file's requests (OpenAI's bound)
    max_file_bytes: int = 200 << 20     # an input file's size (OpenAI's bound)
    max_files_per_key: int = 1000       # files an owner stores (uploads and outputs)
    max_active_batches_per_key: int = 100  # an owner's jobs not yet finished


def not_found(kind: str, id_: str, param: str | None = None) -> ApiError:
    return ApiError(404, f"no {kind} with id {id_!r}", param, "not_found")


def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


class BatchStore:
    def __init__(self, folder: str | os.PathLike, limits: Limits = Limits(), clock: Callable[[], float] = time.time):
        self.folder = Path(folder)
        self.limits, self.clock = limits, clock
        self.files_dir = self.folder / "files"
        self.work_dir = self.folder / "work"
        self.uploads_dir = self.folder / "uploads"  # uploads being received
        for path in (self.files_dir, self.work_dir, self.uploads_dir):
            path.mkdir(parents=True, exist_ok=True)
        for left in self.uploads_dir.iterdir():  # a day old: left by a process that died receiving it
            if left.stat().st_mtime < time.time() - STALE_UPLOAD_S:
                left.unlink(missing_ok=True)
        self._lock = threading.Lock()
        self.on_batch_created: list[Callable[[], None]] = []  # this process's runners (BatchRunner.wake)
        self._db = connect_shared(self.folder / "batches.sqlite3", timeout=10)
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _rows(self, sql: str, *args) -> list[tuple]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    def _write(self, statements: list[tuple[str, tuple]]) -> list[int]:
        """Run `statements` in one transaction; -> the rows each changed."""
        with self._lock, immediate(self._db):
            return [self._db.execute(sql, args).rowcount for sql, args in statements]

    # files

    def file_path(self, file_id: str) -> Path:
        return self.files_dir / file_id

    def upload_path(self) -> Path:
        return self.uploads_dir / new_id("upload-")

    def add_file(self, owner: str, source: Path, filename: str, purpose: str, num_bytes: int,
                 expires_at: int | None = None) -> dict:
        """Keep `source` (moved in) as a new file of `owner`'s."""
        (count,), = self._rows("SELECT COUNT(*) FROM files WHERE owner = ?", owner)
        if count >= self.limits.max_files_per_key:
            raise ApiError(429, f"this key stores {count} files; at most {self.limits.max_files_per_key}: "
                                "delete some (DELETE /v1/files/{id})", None, "file_limit_exceeded")
        body = {"id": new_id("file-"), "object": "file", "bytes": num_bytes, "created_at": int(self.clock()),
                "expires_at": expires_at, "filename": filename, "purpose": purpose, "status": "processed",
                "status_details": None}
        os.replace(source, self.file_path(body["id"]))
        self._write([self._file_row(owner, body)])
        return body

    @staticmethod
    def _file_row(owner: str, body: dict) -> tuple[str, tuple]:
        return ("INSERT OR IGNORE INTO files (id, owner, purpose, expires_at, body) VALUES (?, ?, ?, ?, ?)",
                (body["id"], owner, body["purpose"], body["expires_at"], orjson.dumps(body).decode()))

    def set_file_expiry(self, file_id: str, expires_at: int) -> dict:
        rows = self._rows("SELECT owner, body FROM files WHERE id = ?", file_id)
        body = {**orjson.loads(rows[0][1]), "expires_at": expires_at}
        self._write([("UPDATE files SET expires_at = ?, body = ? WHERE id = ?",
                      (expires_at, orjson.dumps(body).decode(), file_id))])
        return body

    def file(self, owner: str, file_id: str) -> dict:
        """The file's object; an expired file is deleted now (whenever the runner's sweep would): 404."""
        rows = self._rows("SELECT body, expires_at FROM files WHERE id = ? AND owner = ?", file_id, owner)
        if rows and self._expired(rows[0][1]):
            self._delete_files([file_id])
            rows = []
        if not rows:
            raise not_found("file", file_id, "file_id")
        return orjson.loads(rows[0][0])

    def _expired(self, expires_at: int | None) -> bool:
        return expires_at is not None and expires_at <= self.clock()

    def list_files(self, owner: str, purpose: str | None, limit: int, order: str, after: str | None
                   ) -> tuple[list[dict], bool]:
        where, args = "owner = ? AND (expires_at IS NULL OR expires_at > ?)", [owner, int(self.clock())]
        if purpose:
            where, args = where + " AND purpose = ?", args + [purpose]
        return self._page("files", where, args, limit, order, after)

    def delete_file(self, owner: str, file_id: str) -> dict:
        self.file(owner, file_id)
        self._write([("DELETE FROM files WHERE id = ? AND owner = ?", (file_id, owner))])
        self.file_path(file_id).unlink(missing_ok=True)
        return {"id": file_id, "object": "file", "deleted": True}

    def delete_expired_files(self) -> int:
        expired = [r[0] for r in self._rows("SELECT id FROM files WHERE expires_at IS NOT NULL AND expires_at <= ?",
                                            int(self.clock()))]
        self._delete_files(expired)
        return len(expired)

    def _delete_files(self, file_ids: list[str]) -> None:
        if file_ids:
            self._write([("DELETE FROM files WHERE id = ?", (file_id,)) for file_id in file_ids])
            for file_id in file_ids:
                self.file_path(file_id).unlink(missing_ok=True)

    def _page(self, table: str, where: str, args: list, limit: int, order: str, after: str | None
              ) -> tuple[list[dict], bool]:
        """Rows in creation order (`asc`) or newest first (`desc`), after the row with id `after`."""
        op, direction = (">", "ASC") if order == "asc" else ("<", "DESC")
        if after:
            rows = self._rows(f"SELECT rowid FROM {table} WHERE id = ? AND {where}", after, *args)
            if not rows:
                raise not_found(table.rstrip("s"), after, "after")
            where, args = f"{where} AND rowid {op} ?", args + [rows[0][0]]
        rows = self._rows(f"SELECT body FROM {table} WHERE {where} ORDER BY rowid {direction} LIMIT ?",
                          *args, limit + 1)
        return [orjson.loads(r[0]) for r in rows[:limit]], len(rows) > limit

    # batches

    def create_batch(self, owner: str, endpoint: str, input_file_id: str, completion_window_s: int,
                     completion_window: str, metadata: dict | None, output_expires_after_s: int | None) -> dict:
        try:
            input_file = self.file(owner, input_file_id)
        except ApiError:
            raise not_found("file", input_file_id, "input_file_id") from None
        if input_file["purpose"] != "batch":
            raise ApiError(400, f"file {input_file_id!r} has purpose {input_file['purpose']!r}; a batch reads a "
                                "file uploaded with purpose 'batch'", "input_file_id", "invalid_value")
        (active,), = self._rows(f"SELECT COUNT(*) FROM batches WHERE owner = ? AND status IN "
                                f"({','.join('?' * len(RUNNABLE))})", owner, *RUNNABLE)
        if active >= self.limits.max_active_batches_per_key:
            raise ApiError(429, f"this key has {active} unfinished batches; at most "
                                f"{self.limits.max_active_batches_per_key}: wait for some or cancel them", None,
                           "batch_limit_exceeded")
        now = int(self.clock())
        body = {"id": new_id("batch_"), "object": "batch", "endpoint": endpoint, "errors": None,
                "input_file_id": input_file_id, "completion_window": completion_window, "status": "validating",
                "output_file_id": None, "error_file_id": None, "created_at": now, "in_progress_at": None,
                "expires_at": now + completion_window_s, "finalizing_at": None, "completed_at": None,
                "failed_at": None, "expired_at": None, "cancelling_at": None, "cancelled_at": None,
                "request_counts": {"total": 0, "completed": 0, "failed": 0}, "metadata": metadata,
                "output_expires_after_s": output_expires_after_s}
        self._write([("INSERT INTO batches (id, owner, status, body) VALUES (?, ?, ?, ?)",
                      (body["id"], owner, body["status"], orjson.dumps(body).decode()))])
        for wake in self.on_batch_created:
            wake()
        return body

    def batch(self, owner: str, batch_id: str) -> dict:
        rows = self._rows("SELECT body FROM batches WHERE id = ? AND owner = ?", batch_id, owner)
        if not rows:
            raise not_found("batch", batch_id, "batch_id")
        return orjson.loads(rows[0][0])

    def list_batches(self, owner: str, limit: int, after: str | None) -> tuple[list[dict], bool]:
        return self._page("batches", "owner = ?", [owner], limit, "desc", after)

    def cancel(self, owner: str, batch_id: str) -> dict:
        """validating or in_progress -> cancelling (the runner stops and keeps what is done)."""
        body = self.batch(owner, batch_id)
        if body["status"] in CANCELLABLE:
            body.update(status="cancelling", cancelling_at=int(self.clock()))
            changed, = self._write([("UPDATE batches SET status = ?, body = ? WHERE id = ? AND status IN (?, ?)",
                                     (body["status"], orjson.dumps(body).decode(), batch_id, *CANCELLABLE))])
            if changed:
                return body
            body = self.batch(owner, batch_id)  # it moved on meanwhile
        if body["status"] in ("cancelling", "cancelled"):
            return body
        raise ApiError(409, f"batch {batch_id!r} is {body['status']}: only a validating or in_progress batch can "
                            "be cancelled", "batch_id", "batch_not_cancellable")

    # the runner's side

    def claim(self, runner: str, lease_s: float) -> tuple[str, dict] | None:
        """Take the lease of the oldest runnable job whose lease is free or expired: (owner, body)."""
        now = time.time()
        with self._lock, immediate(self._db):
            row = self._db.execute(
                f"SELECT id, owner, body FROM batches WHERE status IN ({','.join('?' * len(RUNNABLE))}) "
                "AND lease_expires < ? ORDER BY rowid LIMIT 1", (*RUNNABLE, now)).fetchone()
            if row is not None:
                self._db.execute("UPDATE batches SET lease_owner = ?, lease_expires = ? WHERE id = ?",
                                 (runner, now + lease_s, row[0]))
        return None if row is None else (row[1], orjson.loads(row[2]))

    def renew(self, batch_id: str, runner: str, lease_s: float) -> str | None:
        """Extend `runner`'s lease; -> the job's status now, None if the lease is no longer its.
        A lease whose time ran out stays its runner's until another runner claims it (`claim`
        changes the owner in the same transaction), so a runner that was held up goes on."""
        changed, = self._write([("UPDATE batches SET lease_expires = ? WHERE id = ? AND lease_owner = ?",
                                 (time.time() + lease_s, batch_id, runner))])
        if not changed:
            return None
        return self._rows("SELECT status FROM batches WHERE id = ?", batch_id)[0][0]

    def release(self, batch_id: str, runner: str) -> None:
        self._write([("UPDATE batches SET lease_owner = NULL, lease_expires = 0 WHERE id = ? AND lease_owner = ?",
                      (batch_id, runner))])

    def update(self, batch_id: str, runner: str, changes: dict, new_files: tuple[tuple[str, dict], ...] = ()
               ) -> dict | None:
        """Apply `changes` to the job's body (and insert `new_files`, its output files, in the same
        transaction) while `runner` holds the lease; -> the body, None if the lease was lost.
        A cancel that arrived meanwhile stays: `in_progress` does not replace `cancelling`."""
        with self._lock, immediate(self._db):
            row = self._db.execute("SELECT body FROM batches WHERE id = ? AND lease_owner = ?",
                                   (batch_id, runner)).fetchone()
            if row is None:
                return None
            body = orjson.loads(row[0])
            if body["status"] == "cancelling" and changes.get("status") == "in_progress":
                changes = {k: v for k, v in changes.items() if k != "status"}
            body.update(changes)
            for owner, file_body in new_files:
                self._db.execute(*self._file_row(owner, file_body))
            self._db.execute("UPDATE batches SET status = ?, body = ? WHERE id = ?",
                             (body["status"], orjson.dumps(body).decode(), batch_id))
        return body

    def status(self, batch_id: str) -> str:
        return self._rows("SELECT status FROM batches WHERE id = ?", batch_id)[0][0]

    def output_file_body(self, file_id: str, filename: str, expires_at: int | None) -> dict:
        """The file object of a job's output `file_id` (already at file_path(file_id)); the runner
        inserts it with the job's last update (`update`'s `new_files`)."""
        return {"id": file_id, "object": "file", "bytes": self.file_path(file_id).stat().st_size,
                "created_at": int(self.clock()), "expires_at": expires_at, "filename": filename,
                "purpose": OUTPUT_PURPOSE, "status": "processed", "status_details": None}
