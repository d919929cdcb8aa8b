"""Is the gateway's own machinery alive: the dispatcher, its slot workers and the backend's
loops (health checks, DNS refresh)? Liveness (`/livez`) is that alone: Triton being down
is readiness (`/health`), and restarting the gateway would not help it. An event loop that
is blocked answers neither route, so a probe with a timeout fails on it too."""
from __future__ import annotations

import asyncio
import logging
import weakref

LIVENESS_PATH = "/livez"  # readiness: /health (gateway/app.py)

log = logging.getLogger("gateway")
_logged: weakref.WeakSet = weakref.WeakSet()  # tasks whose end is logged already (probes ask often)


def _ended_badly(task: asyncio.Task) -> bool:
    """Cancelled or failed: a loop that returns (DNS refresh with nothing to resolve) is fine."""
    return task.done() and (task.cancelled() or task.exception() is not None)


def _log_once(task: asyncio.Task, what: str) -> None:
    if task not in _logged:
        _logged.add(task)
        error = None if task.cancelled() else task.exception()
        log.error("%s (%s) ended: %r", what, task.get_name(), error or "cancelled")


def problems(backend) -> list[str]:
    """What is dead in the gateway's own machinery; [] when everything runs. The messages
    name no replica address (the routes are open); the log has the details."""
    dispatcher = backend.dispatcher
    if dispatcher is None:
        return ["the dispatcher is not running"]
    if dispatcher._closing:
        return ["the dispatcher is closed"]
    found = []
    # Workers of dropped replicas leave `_workers` when dropped: every task left here should run.
    workers = [w for ws in dispatcher._workers.values() for w in ws]
    dead = [w for w in workers if w.done()]
    for worker in dead:
        _log_once(worker, "a dispatcher slot worker")
    if dead:
        found.append(f"{len(dead)} of {len(workers)} dispatcher slot workers ended")
    for loop in backend.loops:
        if _ended_badly(loop):
            name = loop.get_coro().__qualname__
            _log_once(loop, name)
            found.append(f"the gateway loop {name} ended")
    return found
