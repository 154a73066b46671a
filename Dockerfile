# whywait (engine, simulator, agent) in one image; see docker-compose.yml.
# The image needs no Java: it talks to the Kafka at $WHYWAIT_KAFKA_BOOTSTRAP.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
# Only what the package and its rules need (never a local .venv or caches).
COPY pyproject.toml setup.py README.md ./
COPY whywait ./whywait
COPY agents ./agents
COPY engine ./engine
COPY topology ./topology
COPY simulate ./simulate
COPY rules ./rules
# The `gpu` extra: NVML's bindings for the agent (the library itself comes from the host's driver through
# the NVIDIA container runtime). The `plot` extra: replay --plot/--report and eval --plot draw PNGs inside the container too.
# The shipped rules are package data (whywait/rules in site-packages); a site's own rules are mounted at
# /etc/whywait/rules and hot-reloaded (see docker-compose.yml), so editing them needs no rebuild.
RUN pip install '.[plot,gpu]' \
    && useradd --create-home --uid 10001 whywait \
    && mkdir -p /shared /etc/whywait/rules && chown whywait /shared \
    && rm -rf /app/*

USER whywait
ENTRYPOINT ["whywait"]
CMD ["--help"]
