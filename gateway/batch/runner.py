"""The batch runner: each gateway worker runs one. It claims a runnable job's lease (store.py),
runs its lines through the call it is given (the gateway's own handlers and dispatch at the
`batch` class: gateway/http/inprocess.py), appends each answer to the job's output or error file
as it comes, and finishes the job (completed, cancelled, expired) with those files as its outputs.

Durable progress is the results files themselves: a runner that takes a job over (the previous
one died, its lease expired) skips the lines they hold (lines.done_lines), so every line is
answered once. A runner writes only while its lease is valid by its own clock (renewed every
`tick_s`, trusted for `LEASE_TRUST` of `lease_s`); one that loses it stops writing at once.

An idle runner looks for a job every `poll_s`, and at once when a job is created in its own
process (`BatchStore.on_batch_created`): a job submitted to an idle worker starts without
waiting for the next look; other processes sharing the folder find it at theirs."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Awaitable, Callable

from engine_lib import faults

from .lines import Line, done_lines, error_line, read_requests, result_line
from .store import BatchStore

log = logging.getLogger("gateway.batch")
Call = Callable[[str, bytes], Awaitable[tuple[int, bytes]]]  # (endpoint, body) -> (status, response body)
RETRY_STATUSES = frozenset({429, 503, 504})  # the gateway busy or no replica: the line is tried again
LEASE_TRUST = 0.75


@dataclass(frozen=True)
class RunnerSettings:
    concurrency: int = 8          # lines of one job in flight at once
    lease_s: float = 30.0         # a job's lease; a dead runner's job is taken over after it
    poll_s: float = 1.0           # how often an idle runner looks for a job created by another process
    max_body_bytes: int = 8 << 20  # a line's request body (as a live request's)
    retry_max_s: float = 10.0     # the longest wait before a busy line is tried again

    @property
    def tick_s(self) -> float:
        return min(1.0, self.lease_s / 4)


class BatchRunner:
    def __init__(self, store: BatchStore, call: Call, settings: RunnerSettings = RunnerSettings()):
        self.store, self.call, self.settings = store, call, settings
        self.id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self._job_created = asyncio.Event()
        store.on_batch_created.append(self.wake)

    def wake(self) -> None:
        """A job was created in this process: an idle runner looks for it now."""
        self._job_created.set()

    async def run(self) -> None:
        """Until cancelled: drop expired files, claim a job and run it, else wait `poll_s` or a wake."""
        while True:
            claimed = None
            self._job_created.clear()  # a job created from here on wakes the wait below
            try:
                self.store.delete_expired_files()
                claimed = self.store.claim(self.id, self.settings.lease_s)
                if claimed is not None:
                    await JobRun(self, *claimed).run()
            except asyncio.CancelledError:
                raise
            except Exception:  # the store's fault (a full disk, a locked database): wait, then look again
                log.exception("batch runner failed on %s", claimed[1]["id"] if claimed else "its store")
                claimed = None
            if claimed is None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._job_created.wait(), self.settings.poll_s)


class JobRun:
    """One job, from its claim to its release (or the loss of its lease)."""

    def __init__(self, runner: BatchRunner, owner: str, body: dict):
        self.runner, self.store, self.settings = runner, runner.store, runner.settings
        self.owner, self.body, self.id = owner, body, body["id"]
        self.work = self.store.work_dir / self.id
        self.outputs = {"output": self.work / "output.jsonl", "errors": self.work / "errors.jsonl"}
        self.counts = dict(body["request_counts"])
        self.stop: str | None = None  # why no new line starts: cancelled, expired, lost
        self.trusted_until = time.monotonic() + self.settings.lease_s * LEASE_TRUST
        self.counts_dirty = False
        self.files: dict = {}

    async def run(self) -> None:
        ticker = asyncio.create_task(self._tick())
        try:
            await self._run()
        except Exception as exc:  # a fault of the job's own (its input deleted meanwhile, a bug): it fails
            log.exception("batch %s failed", self.id)
            self._fail("job_error", f"the job stopped on an error: {type(exc).__name__}: {exc}")
        finally:
            ticker.cancel()
            await asyncio.gather(ticker, return_exceptions=True)
            for f in self.files.values():
                f.close()
            if self.stop != "lost":
                self.store.release(self.id, self.runner.id)

    async def _run(self) -> None:
        if self.body.get("finishing"):
            return await self._finish(self.body["finishing"])
        if self.body["status"] == "validating":
            if not await self._validate():
                return
        self._see_status(self.body["status"])
        if self.stop:  # cancelled, or past its window before it started
            return await self._finish(self.stop)
        self.work.mkdir(parents=True, exist_ok=True)
        done = {}
        for kind, path in self.outputs.items():
            done[kind] = await asyncio.to_thread(done_lines, path)
        self.counts.update(completed=len(done["output"]), failed=len(done["errors"]))
        skip = done["output"] | done["errors"]
        self.files = {kind: open(path, "ab") for kind, path in self.outputs.items()}
        await self._answer_lines(skip)
        if self.stop == "lost":
            return
        await self._finish({None: "completed", "cancelled": "cancelled", "expired": "expired"}[self.stop])

    async def _validate(self) -> bool:
        """validating -> in_progress with the number of requests, or failed (no readable input)."""
        path = self.store.file_path(self.body["input_file_id"])
        try:
            total = await asyncio.to_thread(lambda: sum(1 for _ in self._lines(path)))
        except OSError as exc:
            return self._fail("input_file_unreadable", f"the input file cannot be read: {exc.strerror}")
        if not total:
            return self._fail("empty_file", "the input file holds no requests")
        self.counts["total"] = total
        return self._update({"status": "in_progress", "in_progress_at": int(self.store.clock()),
                             "request_counts": dict(self.counts)})

    def _fail(self, code: str, message: str) -> bool:
        self._update({"status": "failed", "failed_at": int(self.store.clock()),
                      "errors": {"object": "list", "data": [{"code": code, "message": message, "param":
                                                             "input_file_id", "line": None}]}})
        return False

    def _lines(self, path: Path):
        return read_requests(path, self.body["endpoint"], self.settings.max_body_bytes)

    def _update(self, changes: dict, new_files=()) -> bool:
        body = self.store.update(self.id, self.runner.id, changes, new_files)
        if body is None:
            self.stop = "lost"
            return False
        self.body = body
        return True

    async def _answer_lines(self, skip: set[int]) -> None:
        slots = asyncio.Semaphore(self.settings.concurrency)
        running: set[asyncio.Task] = set()
        for line in self._lines(self.store.file_path(self.body["input_file_id"])):
            if line.number in skip:
                continue
            await slots.acquire()
            if faults.held(faults.BATCH_LINE):  # a test holds the job here, then sees it as it is
                await asyncio.to_thread(faults.wait, faults.BATCH_LINE)
                self._see_status(self.store.status(self.id))
            if self.stop:
                slots.release()
                break
            if line.error:
                self._write("errors", error_line(self.id, line))
                slots.release()
                continue
            task = asyncio.create_task(self._answer(line))
            running.add(task)
            task.add_done_callback(lambda t: (running.discard(t), slots.release()))
        if running:
            await asyncio.gather(*running)

    async def _answer(self, line: Line) -> None:
        wait_s = 0.1
        while True:
            try:
                status, body = await self.runner.call(self.body["endpoint"], line.body)
            except Exception:  # the call answers every failure as a status: this is a bug
                log.exception("batch %s line %d", self.id, line.number)
                status, body = 500, b'{"error":{"message":"internal error","type":"server_error"}}'
            if status not in RETRY_STATUSES or self.stop:
                break
            await asyncio.sleep(wait_s)
            wait_s = min(self.settings.retry_max_s, wait_s * 2)
        if status in RETRY_STATUSES:  # stopped (cancel, expiry) while the gateway was busy: not answered
            return
        self._write("output" if 200 <= status < 300 else "errors", result_line(self.id, line, status, body))

    def _write(self, kind: str, data: bytes) -> None:
        if self.stop != "lost" and time.monotonic() > self.trusted_until:  # the tick is late
            self._renew()  # the lease may be another runner's by now: write only while it is ours
        if self.stop == "lost":
            return
        f = self.files[kind]
        f.write(data)
        f.flush()
        self.counts["completed" if kind == "output" else "failed"] += 1
        self.counts_dirty = True

    async def _tick(self) -> None:
        """Renew the lease, publish the counts, see a cancel or the deadline."""
        while True:
            await asyncio.sleep(self.settings.tick_s)
            if not self._renew():
                return
            if self.counts_dirty:
                self.counts_dirty = False
                self._update({"request_counts": dict(self.counts)})

    def _renew(self) -> bool:
        """Extend the lease and see the job's status; False (and `stop` = lost) if another runner has it."""
        started = time.monotonic()
        status = self.store.renew(self.id, self.runner.id, self.settings.lease_s)
        if status is None:
            self.stop = "lost"
            return False
        self.trusted_until = started + self.settings.lease_s * LEASE_TRUST
        self._see_status(status)
        return True

    def _see_status(self, status: str) -> None:
        """Stop starting lines once the job is cancelled or past its completion window."""
        if self.stop:
            return
        if status == "cancelling":
            self.stop = "cancelled"
        elif self.store.clock() >= self.body["expires_at"]:
            self.stop = "expired"

    async def _finish(self, status: str) -> None:
        """Keep the results files as the job's outputs and end it as `status`. The first update
        records the decision (`finishing`): a runner taking over after a crash goes on from there."""
        for f in self.files.values():
            f.flush()
            os.fsync(f.fileno())
        changes = {"finishing": status}
        if status == "completed":
            changes.update(status="finalizing", finalizing_at=int(self.store.clock()))
        if not self.body.get("finishing") and not self._update(changes):
            return
        hex_id = self.id.removeprefix("batch_")
        new_files, ids = [], {}
        expires_after = self.body.get("output_expires_after_s")
        expires_at = self.body["created_at"] + expires_after if expires_after else None
        for kind, path in self.outputs.items():
            file_id = f"file-{hex_id}-{kind}"
            target = self.store.file_path(file_id)
            if path.exists():
                if path.stat().st_size:
                    os.replace(path, target)
                else:
                    path.unlink()
            if target.exists():
                ids[kind] = file_id
                new_files.append((self.owner, self.store.output_file_body(file_id, f"{self.id}_{kind}.jsonl",
                                                                           expires_at)))
        counts = dict(self.body["request_counts"])
        for kind, key in (("output", "completed"), ("errors", "failed")):
            counts[key] = sum(1 for _ in open(self.store.file_path(ids[kind]), "rb")) if kind in ids else 0
        self._update({"status": status, f"{status}_at": int(self.store.clock()),
                      "output_file_id": ids.get("output"), "error_file_id": ids.get("errors"),
                      "request_counts": counts, "finishing": None},
                     tuple(new_files))
        if self.stop != "lost":
            self.work.rmdir() if self.work.exists() and not any(self.work.iterdir()) else None
