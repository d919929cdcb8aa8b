"""Crashed model stubs, as the kernel log and the process tree show them (the tests).

The kernel logs a process that dies of an unhandled SIGSEGV as
`triton_python_b[PID]: segfault at ADDR ip ... in triton_python_backend_stub[...]` (the
command name is cut to 15 characters; the library named is where the fault was). The ring
buffer is the machine's: other servers' stubs log there too, so a check counts only new
lines naming pids of its own server's stubs.
"""
from __future__ import annotations

import re
import subprocess
from typing import Iterable, Optional

from testing.reliability_helpers import children

STUB = "triton_python_backend_stub"
_SEGFAULT = re.compile(r"\b([\w.-]{1,15})\[(\d+)\]: segfault at ")


def kernel_log() -> Optional[list[str]]:
    """`dmesg` lines, or None where they cannot be read or the kernel does not log segfaults
    (no permission, no dmesg, /proc/sys/debug/exception-trace = 0)."""
    try:
        with open("/proc/sys/debug/exception-trace") as f:
            if f.read().strip() == "0":
                return None
    except OSError:
        pass
    try:
        done = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.splitlines() if done.returncode == 0 else None


def new_lines(before: list[str], after: list[str]) -> list[str]:
    """Lines of `after` not in `before` (dmesg lines carry their timestamp)."""
    seen = set(before)
    return [line for line in after if line not in seen]


def segfaults(lines: Iterable[str], pids: Iterable[int]) -> list[str]:
    """The segfault lines naming one of `pids`."""
    wanted = set(pids)
    return [line for line in lines if (m := _SEGFAULT.search(line)) and int(m.group(2)) in wanted]


def stub_pids(root_pid: int) -> dict[int, str]:
    """{pid: model instance name (e.g. `embed_0_1`)} of the Python backend stubs below `root_pid`."""
    found, todo = {}, [root_pid]
    while todo:
        for pid, cmdline in children(todo.pop()):
            todo.append(pid)
            if STUB in cmdline.split(" ", 1)[0]:
                args = cmdline.split()
                found[pid] = args[-2] if len(args) >= 2 else "?"  # ... <instance name> <kind>
    return found
