# The trainer, the on-call pager and the console, for docker compose. One small image, run as a non-root user.
FROM python:3.11.11-slim-bookworm

RUN useradd --create-home --uid 10001 runwatch \
    && mkdir -p /data/runs /data/pages \
    && chown -R runwatch:runwatch /data

WORKDIR /app
COPY pyproject.toml README.md ./
COPY trainer ./trainer
COPY exporter ./exporter
COPY oncall ./oncall
COPY console ./console
COPY runwatch ./runwatch
# The lab's configuration: the wheel carries it as runwatch/configuration/ (pyproject.toml).
COPY prometheus ./prometheus
COPY alertmanager ./alertmanager
COPY runbooks ./runbooks
COPY grafana ./grafana
RUN pip install --no-cache-dir .

# Log lines reach `docker compose logs` as they are written, not when a buffer fills.
ENV PYTHONUNBUFFERED=1
USER runwatch
EXPOSE 8000 9095 9096
