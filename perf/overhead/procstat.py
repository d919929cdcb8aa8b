"""CPU seconds of a process tree from /proc (the server: tritonserver and its Python stubs)."""
from __future__ import annotations

import os

TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[str, int, float] | None:
    """(comm, parent pid, user + system CPU seconds, exited threads included) or None if it has gone.

    Clock-tick resolution (10 ms): windows of a few hundred requests resolve ~0.05 ms per request."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    comm = text[text.index("(") + 1:text.rindex(")")]
    fields = text[text.rindex(")") + 2:].split()  # fields[0] is field 3 (state)
    return comm, int(fields[1]), (int(fields[11]) + int(fields[12])) / TICKS


def _label(pid: int, comm: str) -> str:
    """Python stubs by model: `stub:<model>` (the stub's first argument is the model's model.py)."""
    if not comm.startswith("triton_python"):
        return comm
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
        parts = args[1].decode().split("/")
        return f"stub:{parts[-3]}" if len(parts) >= 3 else "stub"
    except (OSError, IndexError, UnicodeDecodeError):
        return "stub"


def _all() -> dict[int, tuple[str, int, float]]:
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (stat := _stat(int(name))) is not None:
            out[int(name)] = stat
    return out


def find_named(root: int, comm: str) -> int | None:
    """The first process named `comm` under (or at) `root`, e.g. tritonserver under serve.sh."""
    table = _all()
    todo = [root]
    while todo:
        pid = todo.pop(0)
        if pid in table and table[pid][0] == comm:
            return pid
        todo += [p for p, (_, parent, _) in table.items() if parent == pid]
    return None


def tree_cpu_seconds(root: int) -> dict[str, float]:
    """CPU seconds of `root` and its descendants, summed by command name."""
    table = _all()
    todo, out = [root], {}
    while todo:
        pid = todo.pop()
        if pid not in table:
            continue
        comm, _, seconds = table[pid]
        label = _label(pid, comm)
        out[label] = out.get(label, 0.0) + seconds
        todo += [p for p, (_, parent, _) in table.items() if parent == pid]
    return out


def diff(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before.get(k, 0.0) for k in after}
