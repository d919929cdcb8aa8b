"""`python -m gateway --triton HOST:PORT [--triton ...]`: serve the OpenAI-compatible API."""
import logging

import uvicorn

from .app import create_app
from .config import parse_args


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="[gateway] %(asctime)s %(levelname)s %(message)s")
    config = parse_args()
    uvicorn.run(create_app(config), host=config.host, port=config.port, loop="uvloop", http="httptools",
                log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
