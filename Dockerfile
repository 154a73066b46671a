# whywait (engine, simulator, agent) in one image; see docker-compose.yml.
# The image needs no Java: it talks to the Kafka at $WHYWAIT_KAFKA_BOOTSTRAP.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
# Only what the package and its rules need (never a local .venv or caches).
COPY pyproject.toml README.md ./
COPY agents ./agents
COPY engine ./engine
COPY topology ./topology
COPY rules ./rules
RUN pip install . \
    && useradd --create-home --uid 10001 whywait \
    && mkdir -p /shared && chown whywait /shared

ENV WHYWAIT_RULES=/app/rules
USER whywait
ENTRYPOINT ["whywait"]
CMD ["--help"]
