"""What the gateway's unit tests share."""
import pytest

import gateway.http.plumbing as plumbing


@pytest.fixture(autouse=True, scope="module")
def one_tokenizer():
    """Load the tokenizer once per module, not once per app."""
    original, loaded = plumbing.GatewayTokenizer, {}
    plumbing.GatewayTokenizer = lambda *args: loaded.get(args) or loaded.setdefault(args, original(*args))
    yield
    plumbing.GatewayTokenizer = original
