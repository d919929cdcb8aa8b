"""The client depends on the wire contract (rose_wire), never on the server's packages."""
import pkgutil
import subprocess
import sys

import rose_client
from testing import REPO

SERVER_PACKAGES = ("engine_lib", "rose_triton")
MODULES = sorted(f"rose_client.{m.name}" for m in pkgutil.iter_modules(rose_client.__path__))


def test_no_client_module_imports_the_server():
    """Each module imported in turn in a fresh interpreter; a server package it pulls in is named with it."""
    code = ("import importlib, sys\n"
            f"for name in {['rose_client', *MODULES]!r}:\n"
            "    importlib.import_module(name)\n"
            f"    server = sorted(m for m in sys.modules if m.split('.')[0] in {SERVER_PACKAGES!r})\n"
            "    print(name, *server)\n")
    found = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    lines = found.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["rose_client", *MODULES]  # every module was imported
    assert "rose_client.aio_stream" in MODULES and "rose_client.bulk" in MODULES
    assert [line for line in lines if len(line.split()) > 1] == []
