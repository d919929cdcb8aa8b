"""Resumable output of a bulk job.

Rows go into `OUT.partial.npy` (a memory-mapped [N, D] float32 file) and each
finished chunk is appended to `OUT.journal` only after its rows were flushed
to disk, so a journal line always means "these rows are on disk". A resumed
job skips journaled chunks; a half-written last line is ignored (that chunk
is simply embedded again). On completion the final file replaces both.

The journal's header records the job, the served model's identity among it
(identity.py): resuming against another model raises ModelMismatch. `OutputLock`
(OUT.lock) keeps a second run off an output that a live run is writing.
"""
from __future__ import annotations

import fcntl
import json
import os
import socket
from typing import Sequence

import numpy as np

from .chunking import Chunk
from .identity import ModelIdentity, ModelMismatch

FORMATS = (".npy", ".parquet")


class ResumeMismatch(RuntimeError):
    """The journal next to the output belongs to a different job."""


class OutputLocked(RuntimeError):
    """Another run, still alive, is writing the same output."""


class OutputLock:
    """OUT.lock, flock()ed while a run writes OUT: a second run fails at once, naming the
    holder. The kernel drops the lock when its process dies, so the file a killed run left
    behind is taken over (`stale_holder` says whose it was)."""

    def __init__(self, output_path: str):
        self.output_path = output_path
        self.path = output_path + ".lock"
        self.stale_holder = ""
        self._file = None

    def acquire(self) -> "OutputLock":
        while True:
            lock_file = open(self.path, "a+")
            try:
                fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(lock_file)
                lock_file.close()
                raise OutputLocked(f"{self.path}: another run ({holder or 'holder unknown'}) is writing "
                                   f"{self.output_path}; wait for it to end or stop it") from None
            if _is_current(lock_file, self.path):
                break
            lock_file.close()  # the run we waited on removed it as we opened it: take the new one
        self.stale_holder = _holder(lock_file)
        lock_file.seek(0)
        lock_file.truncate()
        lock_file.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
        lock_file.flush()
        self._file = lock_file
        return self

    def release(self) -> None:
        if self._file is not None:
            try:
                os.remove(self.path)  # still locked: whoever opens it now retries on a fresh file
            except FileNotFoundError:
                pass
            self._file.close()
            self._file = None

    def __enter__(self) -> "OutputLock":
        return self.acquire()

    def __exit__(self, *exc_info) -> None:
        self.release()


def _holder(lock_file) -> str:
    lock_file.seek(0)
    return lock_file.read().strip()


def _is_current(lock_file, path: str) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(lock_file.fileno()).st_ino
    except FileNotFoundError:
        return False


class ResumableOutput:
    def __init__(self, output_path: str, job: dict):
        if not output_path.endswith(FORMATS):
            raise ValueError(f"output {output_path!r}: name must end in {' or '.join(FORMATS)}")
        self.output_path = output_path
        self.partial_path = output_path + ".partial.npy"
        self.journal_path = output_path + ".journal"
        # What must match to resume: input hash, chunk plan, request parameters, and under
        # "model" the served model's identity (ModelIdentity.to_json(), matched with tolerance).
        self.job = job
        self._rows: np.ndarray | None = None
        self._journal = None

    def open(self) -> set[int]:
        """-> indices of chunks already on disk (empty for a fresh job)."""
        done: set[int] = set()
        if os.path.exists(self.journal_path) and os.path.exists(self.partial_path):
            done = self._read_journal()
            self._rows = np.load(self.partial_path, mmap_mode="r+")
            if self._rows.shape[0] != self.job["num_texts"]:
                raise ResumeMismatch(f"{self.partial_path} has {self._rows.shape[0]} rows, "
                                     f"the job {self.job['num_texts']}")
            self._journal = open(self.journal_path, "a")
            if self._journal.tell() and not _ends_with_newline(self.journal_path):
                self._journal.write("\n")  # close off a half-written line before appending
        else:
            for stale in (self.partial_path, self.journal_path):
                if os.path.exists(stale):
                    os.remove(stale)
            self._journal = open(self.journal_path, "w")
            self._append(self.job)
        return done

    def write(self, chunk: Chunk, rows: np.ndarray) -> None:
        if self._rows is None:
            self._rows = np.lib.format.open_memmap(self.partial_path, mode="w+", dtype=np.float32,
                                                   shape=(self.job["num_texts"], rows.shape[1]))
        if rows.shape != (chunk.num_texts, self._rows.shape[1]):
            raise ValueError(f"chunk {chunk.index}: rows {list(rows.shape)}, expected "
                             f"[{chunk.num_texts}, {self._rows.shape[1]}]")
        self._rows[chunk.start:chunk.stop] = rows
        self._rows.flush()
        self._append({"chunk": chunk.index})

    def finish(self, ids: Sequence[str]) -> None:
        """Write the final file (atomically) and remove the partial file and journal."""
        if self._rows is None:
            raise RuntimeError("finish() before any rows were written")
        self._rows.flush()
        if self.output_path.endswith(".npy"):
            self._rows = None
            os.replace(self.partial_path, self.output_path)
        else:
            _write_parquet(self.output_path, ids, self._rows)
            self._rows = None
            os.remove(self.partial_path)
        self.close()
        os.remove(self.journal_path)

    def close(self) -> None:
        if self._journal is not None:
            self._journal.close()
            self._journal = None

    def _append(self, record: dict) -> None:
        self._journal.write(json.dumps(record, sort_keys=True) + "\n")
        self._journal.flush()

    def _read_journal(self) -> set[int]:
        with open(self.journal_path) as f:
            lines = f.read().split("\n")
        try:
            header = json.loads(lines[0])
        except json.JSONDecodeError:
            header = None
        if isinstance(header, dict) and "model" in self.job:
            recorded, served = ModelIdentity.from_json(header.get("model")), ModelIdentity.from_json(self.job["model"])
            if not served.matches(recorded):
                raise ModelMismatch(f"{self.journal_path} was written with model {recorded or header.get('model')}, "
                                    f"the replicas now serve {served}: resuming would mix two models' vectors in "
                                    f"one file; resume against the first model, or delete it to start over")
            header = {**header, "model": self.job["model"]}
        if header != self.job:
            differ = sorted(k for k in self.job if not isinstance(header, dict) or header.get(k) != self.job[k])
            raise ResumeMismatch(f"{self.journal_path} belongs to another job (differs in {differ}); "
                                 f"rerun with the same input and options, or delete it to start over")
        done = set()
        for line in lines[1:]:
            try:
                done.add(int(json.loads(line)["chunk"]))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                continue  # the half-written last line of an interrupted run
        return done


def _ends_with_newline(path: str) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


def _write_parquet(path: str, ids: Sequence[str], rows: np.ndarray) -> None:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise RuntimeError("writing Parquet needs pyarrow (pip install pyarrow); or write .npy") from None
    embedding = pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(rows).reshape(-1)), rows.shape[1])
    table = pa.table({"id": pa.array(list(ids), pa.string()), "embedding": embedding})
    tmp = path + ".tmp"
    pq.write_table(table, tmp)
    os.replace(tmp, path)
