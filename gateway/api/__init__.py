"""The HTTP API, one module per family; each handler is `async def name(gateway, request) -> Response`,
routed in gateway/app.py."""
