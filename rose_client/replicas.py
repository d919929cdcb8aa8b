"""Replica addresses: `host:port` as given, or every address a DNS name resolves
to (`dns:///name:port`, e.g. a Kubernetes headless Service: one per ready pod)."""
from __future__ import annotations

import socket

DNS_PREFIX = "dns:///"


def split_host_port(address: str, default_port: int = 8001) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or host.endswith(":"):  # no port, or a bare IPv6 address
        return address.strip("[]"), default_port
    if not port.isdigit():
        raise ValueError(f"replica address {address!r}: port {port!r} is not a number")
    return host.strip("[]"), int(port)


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def resolve_replicas(addresses: list[str], default_port: int = 8001) -> list[str]:
    """Expand `dns:///` entries into one address per resolved IP; keep order, drop repeats."""
    resolved: list[str] = []
    for address in addresses:
        if address.startswith(DNS_PREFIX):
            host, port = split_host_port(address[len(DNS_PREFIX):], default_port)
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            found = sorted({info[4][0] for info in infos})
            if not found:
                raise ValueError(f"{address}: resolves to no address")
            resolved += [_join(ip, port) for ip in found]
        else:
            resolved.append(_join(*split_host_port(address, default_port)))
    return list(dict.fromkeys(resolved))
