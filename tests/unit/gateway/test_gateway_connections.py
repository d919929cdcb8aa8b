"""The connection bounds (gateway/http/connections.py) on the gateway's uvicorn protocol:
a connection counts as receiving from a request's first byte to its body's last, past the
bounds in all and per address it gets 503 / 429 in OpenAI's error JSON and is closed (health
probes pass on places of their own), and past the open-connection bound (from the file
descriptor limit) 503 at once. Over real
sockets: a gateway whose file descriptor limit is lowered refuses cleanly and serves on."""
import asyncio
import resource
import socket

import orjson
import pytest
import uvicorn
from uvicorn.server import ServerState

from gateway.config import GatewayConfig, parse_args
from gateway.http.connections import PROBE_PLACES, ConnectionBounds, open_connection_bound
from gateway.http.protocol import limited_protocol
from testing.gateway_process import GatewayProcess
from testing.waiting import wait_until


class Transport(asyncio.Transport):
    def __init__(self, address: str):
        super().__init__()
        self.address, self.written, self.closed = address, bytearray(), False
        self.protocol = None

    def write(self, data):
        self.written += data

    def close(self):
        if not self.closed:
            self.closed = True
            asyncio.get_running_loop().call_soon(self.protocol.connection_lost, None)

    def is_closing(self):
        return self.closed

    def get_extra_info(self, name, default=None):
        return {"peername": (self.address, 5000), "sockname": ("127.0.0.1", 8080)}.get(name, default)

    def pause_reading(self):
        pass

    def resume_reading(self):
        pass


class Server:
    """The gateway's protocol on fake transports, sharing `bounds`; the app reads the whole
    body, then answers once `answer` is set."""

    def __init__(self, bounds: ConnectionBounds):
        self.bounds, self.answer = bounds, asyncio.Event()

        async def app(scope, receive, send):
            if scope["type"] != "http":
                return
            while (await receive()).get("more_body"):
                pass
            await self.answer.wait()
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
            await send({"type": "http.response.body", "body": b"ok"})

        self.config = uvicorn.Config(app, http=limited_protocol(GatewayConfig(), bounds), lifespan="off",
                                     log_level="critical")
        self.config.load()
        self.state = ServerState()

    def connect(self, address: str = "10.0.0.1") -> Transport:
        protocol = self.config.http_protocol_class(config=self.config, server_state=self.state, app_state={})
        transport = Transport(address)
        transport.protocol = protocol
        protocol.connection_made(transport)
        return transport


def refusal(transport: Transport) -> tuple[int, dict, bytes]:
    head, _, body = bytes(transport.written).partition(b"\r\n\r\n")
    assert transport.closed and b"connection: close" in head and b"retry-after: 1" in head
    return int(head.split()[1]), orjson.loads(body)["error"], head


def run(scenario, max_receiving=1024, per_client=64, max_open=None):
    async def main():
        server = Server(ConnectionBounds(max_receiving, per_client, max_open))
        return await asyncio.wait_for(scenario(server, server.bounds), 30)

    return asyncio.run(main())


async def settle():
    for _ in range(5):
        await asyncio.sleep(0)


def test_a_connection_is_receiving_from_a_requests_first_byte_to_its_bodys_last():
    async def scenario(server, bounds):
        seen = []
        connection = server.connect()
        seen.append(bounds.receiving)  # connected, silent
        connection.protocol.data_received(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n12345")
        seen.append(bounds.receiving)  # part of the body
        connection.protocol.data_received(b"67890")
        await settle()
        seen.append(bounds.receiving)  # the body is in: being answered
        server.answer.set()
        await settle()
        seen.append(bounds.receiving)  # answered: idle on keep-alive
        connection.protocol.data_received(b"GET / HT")
        seen.append(bounds.receiving)  # the next request began
        connection.close()
        await settle()
        return seen, bytes(connection.written), bounds.receiving, bounds.open

    seen, written, receiving, open_ = run(scenario)
    assert seen == [0, 1, 0, 0, 1] and written.startswith(b"HTTP/1.1 200 ")
    assert receiving == 0 and open_ == 0


def test_past_an_address_bound_429_past_the_whole_bound_503_and_a_freed_place_is_taken():
    async def scenario(server, bounds):
        head = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Len"
        a1, a2, a3 = (server.connect("10.0.0.1") for _ in range(3))
        for connection in (a1, a2):
            connection.protocol.data_received(head)
        idle = server.connect("10.0.0.1")  # connected and silent: not receiving
        a3.protocol.data_received(head)
        b1 = server.connect("10.0.0.2")
        b1.protocol.data_received(head)
        c1 = server.connect("10.0.0.3")
        c1.protocol.data_received(head + b"gth: 5\r\n\r\n")  # refused once its headers show it is no probe
        await settle()
        counts = bounds.receiving, dict(bounds.receiving_by_client), bounds.open
        a1.close()
        await settle()
        c2 = server.connect("10.0.0.3")
        c2.protocol.data_received(head)
        return counts, a3, c1, c2, idle, bounds.receiving

    counts, a3, c1, c2, idle, receiving = run(scenario, max_receiving=3, per_client=2)
    assert counts == (3, {"10.0.0.1": 2, "10.0.0.2": 1}, 4)  # the refused ones closed, the silent one open
    status, error, _ = refusal(a3)
    assert status == 429 and error["code"] == "rate_limit_exceeded" and "at most 2" in error["message"]
    status, error, _ = refusal(c1)
    assert status == 503 and error["code"] == "server_busy" and "at most 3" in error["message"]
    assert not c2.closed and not c2.written and not idle.closed and receiving == 3


def test_past_the_whole_bound_health_probes_still_pass_on_a_few_places_of_their_own():
    async def scenario(server, bounds):
        server.answer.set()
        stalled = server.connect("10.0.0.1")
        stalled.protocol.data_received(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n123")
        probes = []
        for path in (b"/livez", b"/health"):
            probes.append(server.connect("10.0.0.2"))
            probes[-1].protocol.data_received(b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        other = server.connect("10.0.0.2")
        other.protocol.data_received(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
        await settle()  # its place comes back once it is closed
        slow = [server.connect(f"10.0.1.{i}") for i in range(PROBE_PLACES)]
        for connection in slow:
            connection.protocol.data_received(b"GET /liv")  # a probe's first bytes: on a probe place
        late = server.connect("10.0.0.3")
        late.protocol.data_received(b"G")
        await settle()
        return probes, other, slow, late, bounds.receiving, bounds.probing

    probes, other, slow, late, receiving, probing = run(scenario, max_receiving=1)
    assert all(bytes(p.written).startswith(b"HTTP/1.1 200 ") for p in probes)
    status, error, _ = refusal(other)  # answered once its path showed it is no probe
    assert status == 503 and error["code"] == "server_busy"
    assert not any(c.closed for c in slow) and (receiving, probing) == (1, PROBE_PLACES)
    status, error, _ = refusal(late)  # no probe place left: refused at its first byte
    assert status == 503 and error["code"] == "server_busy"


def test_past_the_open_connection_bound_503_at_once():
    async def scenario(server, bounds):
        first, second, third = (server.connect() for _ in range(3))
        await settle()
        counts = bounds.open
        first.close()
        await settle()
        return counts, second, third, server.connect(), bounds.open

    counts, second, third, fourth, open_ = run(scenario, max_open=2)
    status, error, _ = refusal(third)
    assert status == 503 and error["code"] == "server_busy" and "file descriptor limit" in error["message"]
    assert counts == 2 and not second.closed and not fourth.closed and open_ == 2


def test_the_bounds_are_settings_checked_like_the_others():
    config = parse_args(["--max-receiving-connections", "10", "--max-receiving-per-client", "3",
                         "--max-buffered-body-bytes", str(64 << 20)])
    assert (config.max_receiving_connections, config.max_receiving_per_client,
            config.max_buffered_body_bytes) == (10, 3, 64 << 20)
    for flag in ("--max-receiving-connections", "--max-receiving-per-client"):
        with pytest.raises(ValueError, match=">= 1"):
            parse_args([flag, "0"])
    with pytest.raises(ValueError, match="must be >= max_body_bytes"):
        parse_args(["--max-body-bytes", "2000", "--max-buffered-body-bytes", "1000"])


def test_the_open_connection_bound_leaves_a_reserve_of_descriptors():
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert open_connection_bound() == (None if soft == resource.RLIM_INFINITY else soft - min(128, soft // 4))


def limit_fds(limit: int):
    def lower():
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
    return lower


def answer(sock: socket.socket) -> bytes:
    """The gateway's answer to a GET /livez on `sock` (b"" if it closed, b"reset" if it reset)."""
    try:
        sock.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
        data = bytearray()
        while (chunk := sock.recv(65536)) and not complete(data := data + chunk):
            pass
        return bytes(data)
    except (ConnectionResetError, BrokenPipeError):
        return b"reset"


def complete(reply: bytes) -> bool:
    head, found, body = reply.partition(b"\r\n\r\n")
    length = [line.split(b":")[1] for line in head.lower().split(b"\r\n") if line.startswith(b"content-length:")]
    return bool(found and length) and len(body) >= int(length[0])


@pytest.mark.parametrize("limit, connections", [(300, 260), (60, 100)])
def test_out_of_file_descriptors_the_gateway_refuses_and_serves_on(tmp_path, limit, connections):
    """A gateway allowed `limit` open files (no Triton behind it), and more connections than
    that. At 300 the open-connection bound (300 - 75) refuses each one past it with a 503
    before any accept() fails; at 60 the gateway's own descriptors (about 20) leave fewer
    than the bound (45), so accept() fails with EMFILE and uvloop resets those connections.
    Either way no connection hangs, and once they close the gateway answers as before."""
    gateway = GatewayProcess(tmp_path / "gateway.log", ["127.0.0.1:1"], wait_ready=False,
                             preexec_fn=limit_fds(limit))
    sockets = []
    try:
        for _ in range(connections):
            sockets.append(socket.create_connection(("127.0.0.1", gateway.port), timeout=30))
        replies = [answer(sock) for sock in sockets]
        statuses = [reply.split(b" ", 2)[1] if reply.startswith(b"HTTP/1.1 ") else reply for reply in replies]
        for sock in sockets:
            sock.close()
        wait_until(lambda: gateway.health() is not None, 60, "the gateway to answer again", 0.05)
        assert gateway.process.poll() is None, gateway.log_tail()
    finally:
        for sock in sockets:
            sock.close()
        gateway.stop()
    if limit == 300:
        assert statuses.count(b"200") == 225 and statuses.count(b"503") == connections - 225, set(statuses)
        refused = [r for r in replies if r.startswith(b"HTTP/1.1 503 ")]
        assert all(b"retry-after: 1" in r and b'"code":"server_busy"' in r for r in refused)
    else:
        assert set(statuses) <= {b"200", b"503", b"", b"reset"} and b"200" in statuses, set(statuses)
