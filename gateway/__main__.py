"""`python -m gateway --triton HOST:PORT [--triton ...]`: serve the OpenAI-compatible API."""
import logging

import uvicorn

from .app import create_app
from .config import parse_args
from .http.connections import raise_fd_limit
from .http.keys import read_keys_file
from .http.protocol import limited_protocol


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="[gateway] %(asctime)s %(levelname)s %(message)s")
    try:
        config = parse_args()
        if config.keys_file:
            read_keys_file(config.keys_file)  # missing or broken: one line, before any worker starts
    except ValueError as exc:
        raise SystemExit(f"gateway: {exc}") from None
    if config.workers > 1:
        from .workers import Supervisor

        raise SystemExit(Supervisor(config).run())
    raise_fd_limit()
    app = create_app(config)
    uvicorn.run(app, host=config.host, port=config.port, loop="uvloop",
                http=limited_protocol(config, app.state.gateway.connections),
                timeout_keep_alive=config.keep_alive_timeout_s, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
