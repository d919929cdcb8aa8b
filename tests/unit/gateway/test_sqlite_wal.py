"""gateway/sqlite_wal.py: a file is switched to WAL even while another process holds a lock on it
(SQLite answers that switch with "database is locked" at once, without waiting: a gateway worker
failed its first request so when its sibling was counting)."""
from __future__ import annotations

import sqlite3

import pytest

from gateway import sqlite_wal
from gateway.sqlite_wal import connect_shared


def _holder(path) -> sqlite3.Connection:
    """Another writer in the middle of a transaction on a file not yet in WAL mode."""
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE IF NOT EXISTS t (x INTEGER)")
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("INSERT INTO t VALUES (1)")
    return holder


def test_the_switch_is_refused_at_once_while_another_writer_holds_the_file(tmp_path):
    holder = _holder(tmp_path / "shared.sqlite3")
    plain = sqlite3.connect(tmp_path / "shared.sqlite3", timeout=30, isolation_level=None)
    with pytest.raises(sqlite3.OperationalError, match="locked"):  # the busy timeout does not apply
        plain.execute("PRAGMA journal_mode=WAL")
    holder.execute("ROLLBACK")


def test_connect_shared_tries_again_until_the_writer_is_done(tmp_path, monkeypatch):
    holder = _holder(tmp_path / "shared.sqlite3")
    waits = []

    def writer_finishes(seconds):  # the pause between two tries: the other writer commits meanwhile
        waits.append(seconds)
        holder.execute("COMMIT")

    monkeypatch.setattr(sqlite_wal.time, "sleep", writer_finishes)
    db = connect_shared(tmp_path / "shared.sqlite3", timeout=30)
    assert len(waits) == 1 and db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("SELECT COUNT(*) FROM t").fetchone()[0] == 1


def test_a_file_already_in_wal_needs_no_switch(tmp_path):
    connect_shared(tmp_path / "shared.sqlite3", timeout=5).close()
    holder = sqlite3.connect(tmp_path / "shared.sqlite3", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    db = connect_shared(tmp_path / "shared.sqlite3", timeout=5)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    holder.execute("ROLLBACK")
