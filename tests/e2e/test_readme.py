"""The README's client example runs verbatim against a real server (ports substituted)."""
import re

from testing import REPO

README = REPO / "README.md"


def test_readme_client_example_runs(server, capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README has no python example"
    code = blocks[0].replace("localhost:8000", server.http_url).replace("localhost:8001", server.grpc_url)
    exec(compile(code, "README.md", "exec"), {})
    assert "cosine(query, answer) =" in capsys.readouterr().out


def _openai_section():
    text = README.read_text()
    return text.split("## OpenAI-compatible API", 1)[1].split("\n## ", 1)[0]


def test_readme_openai_examples_run(server, capsys):
    """The curl and openai-client examples of the "OpenAI-compatible API" section, verbatim."""
    import json
    import subprocess

    section = _openai_section().replace("http://127.0.0.1:8080", server.gateway_url)
    (curl,) = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    (code,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    reply = json.loads(subprocess.run(["bash", "-c", curl], capture_output=True, check=True, text=True).stdout)
    assert len(reply["data"]) == 1 and len(reply["data"][0]["embedding"]) == 384
    exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "dimensions: 384" in out and "cosine(query, answer) =" in out


def _section(title: str, level: str = "## ") -> str:
    section = README.read_text().split(f"\n{level}{title}\n", 1)[1]
    return section.split(f"\n{level}", 1)[0].split("\n## ", 1)[0]  # up to the next heading of its level or above


def test_readme_compact_types_example_runs(server, capsys):
    """The tritonclient call asking for EMBEDDINGS_UBINARY (and int8 with its ranges), verbatim."""
    (code,) = re.findall(r"```python\n(.*?)```", _section("Compact output types", "### "), flags=re.S)
    exec(compile(code.replace("localhost:8001", server.grpc_url), "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "hamming(query, answer) =" in out and "cosine of the de-quantized rows =" in out


def test_readme_cohere_example_runs(server, capsys):
    import pytest

    pytest.importorskip("cohere", reason="the cohere SDK (requirements-test.lock) is not installed")
    (code,) = re.findall(r"```python\n(.*?)```", _section("Cohere-compatible API (compact types)"), flags=re.S)
    exec(compile(code.replace("http://127.0.0.1:8080", server.gateway_url), "README.md", "exec"), {})
    assert "int8: (2, 384) ubinary: (2, 48)" in capsys.readouterr().out


def test_readme_batch_example_runs(server, capsys):
    """The Batch API flow through the openai SDK (upload, create, poll, download), verbatim."""
    code = re.findall(r"```python\n(.*?)```", _section("Batch jobs (OpenAI's Batch API, Ray Data)"), flags=re.S)[0]
    exec(compile(code.replace("http://127.0.0.1:8080", server.gateway_url), "README.md", "exec"), {})
    assert "completed 2 rows: ['doc-0', 'doc-1']" in capsys.readouterr().out


def test_readme_sparse_and_multivector_example_runs(multi_server):
    """The /v2/embed call of "Sparse and multi-vector outputs", verbatim, on multi_server's random-weight BGE-M3."""
    import subprocess

    (curl,) = re.findall(r"```bash\n(.*?)```", _section("Sparse and multi-vector outputs"), flags=re.S)
    curl = curl.replace("http://127.0.0.1:8080", multi_server.gateway_url)
    curl = curl.replace('"model": "bge-m3"', f'"model": "{multi_server.retrieval_name}"')
    out = subprocess.run(["bash", "-c", curl], capture_output=True, check=True, text=True).stdout
    # dense width 64; one vector per token after <s> (6 words + </s>); sparse: the positive weights
    assert re.fullmatch(r"dense: 64 sparse: [1-9]\d* vectors: 7\n", out), out
