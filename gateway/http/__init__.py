"""The HTTP side of the gateway: connection and header limits on uvicorn's protocol, request bodies,
and the plumbing every handler uses."""
