"""rose_triton/server.py's TritonServer against a stand-in launcher the test controls: a port
another process took before the server bound it costs one more launch on fresh ports, never a
failed start; any other exit fails at once with the log's tail."""
from __future__ import annotations

import socket
import stat
from pathlib import Path

import pytest

from rose_triton import server as server_module
from rose_triton.server import PortTakenError, TritonServer, free_port

# Stands in for scripts/serve.sh: answers Triton's ready probe on --http-port and logs the line
# Triton logs, after refusing the first launches with Triton's own bind error while the file
# TAKEN_LAUNCHES still counts down.
STAND_IN = r'''#!/usr/bin/env bash
port=$2
left=$(cat "$TAKEN_LAUNCHES")
if (( left > 0 )); then
  echo $((left - 1)) > "$TAKEN_LAUNCHES"
  echo "failed to start HTTP service: Unavailable - Socket '127.0.0.1:$port' already in use"
  exit 1
fi
[[ -n "$OTHER_FAILURE" ]] && { echo "$OTHER_FAILURE"; exit 3; }
echo "Started HTTPService at 127.0.0.1:$port\""
exec python3 - "$port" <<'PY'
import http.server, sys
class Ready(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Ready).serve_forever()
PY
'''


@pytest.fixture
def stand_in_root(tmp_path):
    launcher = tmp_path / "root" / "scripts" / "serve.sh"
    launcher.parent.mkdir(parents=True)
    launcher.write_text(STAND_IN)
    launcher.chmod(launcher.stat().st_mode | stat.S_IXUSR)
    return launcher.parents[1]


def start(root: Path, tmp_path: Path, taken_launches: int, **env) -> TritonServer:
    counter = tmp_path / "taken"
    counter.write_text(str(taken_launches))
    return TritonServer(tmp_path / "server.log", root=root, ready_timeout=60,
                        env={"TAKEN_LAUNCHES": str(counter), **env})


def test_a_port_taken_before_the_bind_costs_a_relaunch_on_fresh_ports(stand_in_root, tmp_path):
    server = start(stand_in_root, tmp_path, taken_launches=server_module.PORT_ATTEMPTS - 1)
    try:
        assert (tmp_path / "taken").read_text().strip() == "0"
        assert server.is_ready()
    finally:
        server.stop()


def test_a_port_taken_at_every_launch_fails_naming_the_port(stand_in_root, tmp_path):
    with pytest.raises(PortTakenError, match="already in use"):
        start(stand_in_root, tmp_path, taken_launches=server_module.PORT_ATTEMPTS)


def test_any_other_exit_fails_at_once_with_the_log(stand_in_root, tmp_path):
    with pytest.raises(RuntimeError, match="model failed to load") as raised:
        start(stand_in_root, tmp_path, taken_launches=0, OTHER_FAILURE="model failed to load")
    assert not isinstance(raised.value, PortTakenError)


def test_free_ports_come_from_below_the_ephemeral_range_and_are_unheld():
    start_of_range = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(20):
        port = free_port()
        assert 1024 <= port < start_of_range
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
