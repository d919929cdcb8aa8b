"""CPU seconds of a server's process tree from /proc (tritonserver and its Python stubs, by model)."""
from __future__ import annotations

import os

TICKS = os.sysconf("SC_CLK_TCK")


def _processes() -> dict[int, tuple[str, int, float]]:
    """pid -> (comm, parent pid, user + system CPU seconds); 10 ms ticks: read over hundreds of requests."""
    out = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat") as f:
                text = f.read()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()  # fields[0] is field 3 (state)
        out[int(name)] = (text[text.index("(") + 1:text.rindex(")")], int(fields[1]),
                          (int(fields[11]) + int(fields[12])) / TICKS)
    return out


def _label(pid: int, comm: str) -> str:
    """Python stubs by model: `stub:<model>` (the stub's first argument is the model's model.py)."""
    if not comm.startswith("triton_python"):
        return comm
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            parts = f.read().split(b"\0")[1].decode().split("/")
        return f"stub:{parts[-3]}" if len(parts) >= 3 else "stub"
    except (OSError, IndexError, UnicodeDecodeError):
        return "stub"


def _tree(root: int, table: dict) -> list[int]:
    """`root` and its descendants, breadth first."""
    order, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        order.append(pid)
        todo += [p for p, (_, parent, _) in table.items() if parent == pid]
    return order


def find_named(root: int, comm: str) -> int | None:
    """The first process named `comm` under (or at) `root`, e.g. tritonserver under serve.sh."""
    table = _processes()
    return next((pid for pid in _tree(root, table) if pid in table and table[pid][0] == comm), None)


def tree_cpu_seconds(root: int) -> dict[str, float]:
    """CPU seconds of `root` and its descendants, summed by command name (stubs by model)."""
    table, out = _processes(), {}
    for pid in (p for p in _tree(root, table) if p in table):
        label = _label(pid, table[pid][0])
        out[label] = out.get(label, 0.0) + table[pid][2]
    return out


def diff(after: dict, before: dict) -> dict:
    return {k: after[k] - before.get(k, 0.0) for k in after}


def add(total: dict, delta: dict) -> dict:
    """Sum nested {key: number | [numbers] | dict} deltas into `total` (returned)."""
    for k, v in delta.items():
        if isinstance(v, dict):
            add(total.setdefault(k, {}), v)
        elif isinstance(v, (list, tuple)):
            total[k] = [a + b for a, b in zip(total.get(k, [0] * len(v)), v)]
        else:
            total[k] = total.get(k, 0) + v
    return total
