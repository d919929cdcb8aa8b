"""Read docker/Dockerfile the way the deploy tests check it."""
import re

from testing import REPO

DOCKERFILE = REPO / "docker" / "Dockerfile"


def instructions(path=DOCKERFILE):
    """[(KEYWORD, arguments)] with continuation lines joined and comments dropped."""
    logical, current = [], ""
    for line in path.read_text().splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line.rstrip("\\").strip() + " "
        if not line.endswith("\\"):
            logical.append(current.strip())
            current = ""
    return [(text.split(None, 1)[0].upper(), text.split(None, 1)[1]) for text in logical]


def image_env():
    env = {}
    for kw, args in instructions():
        if kw == "ENV":
            env.update(re.findall(r"(\w+)=(\S*)", args))
    return env
