"""The README's client example runs verbatim against a real server (ports substituted)."""
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_client_example_runs(server, capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README has no python example"
    code = blocks[0].replace("localhost:8000", server.http_url).replace("localhost:8001", server.grpc_url)
    exec(compile(code, "README.md", "exec"), {})
    assert "cosine(query, answer) =" in capsys.readouterr().out
