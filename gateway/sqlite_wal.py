"""One SQLite file shared by processes (the gateway's workers, its replicas): opened in WAL mode,
written in transactions that take the write lock before their reads."""
from __future__ import annotations

import sqlite3
import time
from contextlib import contextmanager


def connect_shared(path, timeout: float) -> sqlite3.Connection:
    """A connection to `path` in WAL mode, waiting up to `timeout` s for other processes' locks.

    Switching a file to WAL takes its exclusive lock, and SQLite answers that switch with
    "database is locked" at once, without its busy wait, while another process holds a lock
    (two workers opening the file together): the switch is tried again until `timeout`.
    A file already in WAL mode needs no switch."""
    db = sqlite3.connect(path, timeout=timeout, isolation_level=None, check_same_thread=False)
    deadline = time.monotonic() + timeout
    while True:
        try:
            if db.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal":
                return db
            if db.execute("PRAGMA journal_mode=WAL").fetchone()[0].lower() == "wal":
                return db
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                db.close()
                raise
        time.sleep(0.005)


@contextmanager
def immediate(db: sqlite3.Connection):
    """BEGIN IMMEDIATE ... COMMIT (ROLLBACK on an exception): the write lock is taken before the
    reads, so a read-then-write by another process cannot come between them."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
