"""The keys file (`--keys-file`, JSON or YAML, re-read when it changes): key names mapped to a
key's SHA-256, the models it may use, and its limits (gateway/http/limits.py counts them).

    {"keys": {"team-a": {"sha256": "<hex of sha256(key)>", "models": ["all-MiniLM-L6-v2"],
                         "requests_per_minute": 600, "tokens_per_minute": 1000000,
                         "concurrent_requests": 8}}}

Every field but `sha256` is optional (absent: no limit, every model)."""
from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("gateway")
FIELDS = {"sha256", "models", "requests_per_minute", "tokens_per_minute", "concurrent_requests"}
LIMITS = ("requests_per_minute", "tokens_per_minute", "concurrent_requests")


@dataclass(frozen=True)
class KeyEntry:
    name: str
    digest: bytes                     # sha256 of the key
    models: frozenset[str] | None = None  # None: every model
    requests_per_minute: int = 0      # 0: no limit
    tokens_per_minute: int = 0
    concurrent_requests: int = 0

    @property
    def limited(self) -> bool:
        return bool(self.requests_per_minute or self.tokens_per_minute or self.concurrent_requests)


def parse_keys(document, source: str) -> dict[bytes, KeyEntry]:
    """{digest: entry} from a keys file's document; ValueError naming the problem."""
    if not isinstance(document, dict) or not isinstance(document.get("keys"), dict) or set(document) != {"keys"}:
        raise ValueError(f"{source}: expected an object with one field 'keys' (name -> settings)")
    entries: dict[bytes, KeyEntry] = {}
    for name, settings in document["keys"].items():
        where = f"{source}: key {name!r}"
        if not isinstance(settings, dict):
            raise ValueError(f"{where}: expected an object of settings")
        unknown = sorted(set(settings) - FIELDS)
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {unknown}; known: {sorted(FIELDS)}")
        digest = settings.get("sha256")
        try:
            digest = bytes.fromhex(digest) if isinstance(digest, str) else b""
        except ValueError:
            digest = b""
        if len(digest) != 32:
            raise ValueError(f"{where}: 'sha256' must be the 64 hex digits of the key's SHA-256")
        if digest in entries:
            raise ValueError(f"{where}: same key as {entries[digest].name!r}")
        models = settings.get("models")
        if models is not None and (not isinstance(models, list) or not all(isinstance(m, str) for m in models)):
            raise ValueError(f"{where}: 'models' must be a list of model names")
        limits = {}
        for limit in LIMITS:
            value = settings.get(limit)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"{where}: {limit!r} must be an integer >= 1, got {value!r}")
            limits[limit] = value or 0
        entries[digest] = KeyEntry(name, digest, None if models is None else frozenset(models), **limits)
    return entries


def read_keys_file(path: str) -> dict[bytes, KeyEntry]:
    """{digest: entry}; ValueError naming the file and its problem (unreadable, not parsed, a bad entry)."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"keys file {path} cannot be read: {getattr(exc, 'strerror', None) or exc}") from None
    if path.endswith((".yaml", ".yml")):
        import yaml

        try:
            document = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ValueError(f"{path} is not valid YAML: {exc}") from None
    else:
        try:
            document = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} is not valid JSON ({exc}); a YAML file must end in .yaml or .yml") from None
    return parse_keys(document, path)


class KeysFile:
    """The keys file, re-read when it changes (checked on each lookup: one stat). A change that
    does not parse is logged and the keys read before stay in force."""

    def __init__(self, path: str):
        self.path = path
        self.entries = read_keys_file(path)  # a bad file at start: the gateway does not start
        self.signature = self._signature()

    def _signature(self):
        st = os.stat(self.path)
        return st.st_mtime_ns, st.st_size, st.st_ino

    def lookup(self, key: bytes) -> KeyEntry | None:
        self._refresh()
        return self.entries.get(hashlib.sha256(key).digest())

    def _refresh(self) -> None:
        try:
            signature = self._signature()
        except OSError as exc:
            if self.signature is not None:
                log.error("keys file %s unreadable (%s): keeping the keys read before", self.path, exc)
                self.signature = None
            return
        if signature == self.signature:
            return
        self.signature = signature
        try:
            self.entries = read_keys_file(self.path)
            log.info("keys file %s read: %d keys", self.path, len(self.entries))
        except (OSError, ValueError) as exc:
            log.error("keys file %s not applied (%s): keeping the keys read before", self.path, exc)
