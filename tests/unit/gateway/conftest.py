"""What the gateway's unit tests share."""
import pytest

import gateway.app


@pytest.fixture(autouse=True, scope="module")
def one_tokenizer():
    """Load the tokenizer once per module, not once per app."""
    original, loaded = gateway.app.GatewayTokenizer, {}
    gateway.app.GatewayTokenizer = lambda *args: loaded.get(args) or loaded.setdefault(args, original(*args))
    yield
    gateway.app.GatewayTokenizer = original
