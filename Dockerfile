# The trainer, the on-call pager and the console, for docker compose. One small image, run as a non-root user.
FROM python:3.11.11-slim-bookworm

RUN useradd --create-home --uid 10001 runwatch \
    && mkdir -p /data/runs /data/pages /data/targets \
    && chown -R runwatch:runwatch /data

WORKDIR /app
# The dependencies first (and the build backend), read from pyproject.toml alone, in a layer of
# their own: an edit of the code or the configuration rebuilds only the layers below, not numpy,
# matplotlib and MPICH.
# With the cluster extra: MPICH's mpiexec and mpi4py, for RUNWATCH_RANKS > 1 (ldconfig: the mpich
# wheel puts libmpi in the prefix's lib/, which the loader's cache must list where Python's prefix
# is /usr and pip's is /usr/local, as in Debian's python3).
COPY pyproject.toml ./
RUN python -c "import tomllib; d = tomllib.load(open('pyproject.toml', 'rb')); p = d['project']; \
print('\n'.join(p['dependencies'] + p['optional-dependencies']['cluster'] + d['build-system']['requires']))" > /tmp/requirements.txt \
    && pip install --no-cache-dir -r /tmp/requirements.txt && rm /tmp/requirements.txt && ldconfig
COPY README.md ./
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
# runwatch itself, its dependencies and its build backend (setuptools) already in place
RUN pip install --no-cache-dir --no-deps --no-build-isolation . && rm -rf build

# Log lines reach `docker compose logs` as they are written, not when a buffer fills.
ENV PYTHONUNBUFFERED=1
USER runwatch
EXPOSE 8000 9095 9096
