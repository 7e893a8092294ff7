# The trainer, the on-call pager and the console, for docker compose. One small image, run as a non-root user.
FROM python:3.11.11-slim-bookworm

RUN useradd --create-home --uid 10001 runwatch \
    && mkdir -p /data/runs /data/pages /data/targets \
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
# with the cluster extra: MPICH's mpiexec and mpi4py, for RUNWATCH_RANKS > 1
# (ldconfig: the mpich wheel puts libmpi in the prefix's lib/, which the loader's cache must list
# where Python's prefix is /usr and pip's is /usr/local, as in Debian's python3)
RUN pip install --no-cache-dir ".[cluster]" && ldconfig

# Log lines reach `docker compose logs` as they are written, not when a buffer fills.
ENV PYTHONUNBUFFERED=1
USER runwatch
EXPOSE 8000 9095 9096
