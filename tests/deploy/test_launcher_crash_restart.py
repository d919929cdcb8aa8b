"""scripts/serve.sh under supervision starts a fresh tritonserver when one dies of a signal
(a crash: Triton 2.51's Python backend can abort under load), with a growing delay, and not
when it exits with an error of its own (a bad flag or model would fail again). A stand-in
tritonserver counts its starts."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rose_triton.server import REPO, free_port

STAND_IN = """#!/bin/sh
starts=$(( $(cat "$STARTS" 2>/dev/null || echo 0) + 1 ))
echo $starts > "$STARTS"
[ $starts -ge $LAST ] && exit $LAST_STATUS
kill -ABRT $$
"""


def serve(tmp_path, last: int, last_status: int) -> tuple[subprocess.CompletedProcess, int]:
    (tmp_path / "tritonserver").write_text(STAND_IN)
    (tmp_path / "tritonserver").chmod(0o755)
    env = {**os.environ, "ROSE_SKIP_SETUP": "1", "STARTS": str(tmp_path / "starts"), "LAST": str(last),
           "LAST_STATUS": str(last_status), "TMPDIR": str(tmp_path),
           "PATH": f"{tmp_path}:{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}
    run = subprocess.run([str(REPO / "scripts" / "serve.sh"), "--no-gateway", "--http-port", str(free_port())],
                         env=env, capture_output=True, text=True, timeout=120)
    return run, int((tmp_path / "starts").read_text())


def test_a_crashed_tritonserver_is_started_again_with_a_growing_delay(tmp_path):
    run, starts = serve(tmp_path, last=3, last_status=0)
    assert (run.returncode, starts) == (0, 3), run.stderr
    assert "tritonserver died of signal 6; starting a fresh one in 1s" in run.stderr
    assert "tritonserver died of signal 6; starting a fresh one in 2s" in run.stderr


@pytest.mark.parametrize("status", [1, 2])
def test_a_tritonserver_that_exits_with_an_error_is_not_started_again(tmp_path, status):
    run, starts = serve(tmp_path, last=1, last_status=status)
    assert (run.returncode, starts) == (status, 1), run.stderr
    assert "starting a fresh one" not in run.stderr
