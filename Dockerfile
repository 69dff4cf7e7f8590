# The deviceq image: the `deviceq` command (scheduler, host daemon, CLI) on Python 3.11.
#   docker build -t deviceq .
#   docker run --rm deviceq --help
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
# only what the wheel needs: metadata, the Lua transitions and the package
COPY pyproject.toml README.md ./
COPY lua ./lua
COPY src ./src
RUN pip install . \
 && useradd --create-home --uid 10001 deviceq \
 && mkdir -p /tokens \
 && chown deviceq:deviceq /tokens

# a host's token lives in /tokens: in docker-compose.yml a volume of that host's own, written
# by its token-host-N one-shot (the directory is created here so the volume belongs to deviceq)
USER deviceq
ENTRYPOINT ["deviceq"]
CMD ["--help"]
