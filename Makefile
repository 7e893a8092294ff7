# One-command entry points for a fresh Debian or Ubuntu machine.
#   make lab    the lab without Docker (venv, project, Prometheus and Alertmanager, then runwatch up)
#   make test   the same set-up, then the whole test suite
VENV ?= .venv
PY := $(VENV)/bin/python
APT_PACKAGES := prometheus prometheus-alertmanager

.PHONY: lab test binaries lint bench

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

# Debian names Alertmanager's binary prometheus-alertmanager; upstream calls it alertmanager.
binaries:
	@if command -v prometheus >/dev/null && command -v promtool >/dev/null && command -v amtool >/dev/null \
	   && { command -v alertmanager >/dev/null || command -v prometheus-alertmanager >/dev/null; }; then :; \
	elif [ "$$(id -u)" = 0 ]; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(APT_PACKAGES) >/dev/null; \
	else \
	  echo "runwatch needs Prometheus and Alertmanager: run 'sudo apt-get install $(APT_PACKAGES)', then make again"; \
	  exit 1; \
	fi

test: $(VENV)/.installed binaries
	$(PY) -m pytest -q

lab: $(VENV)/.installed binaries
	$(VENV)/bin/runwatch up

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

bench: $(VENV)/.installed
	$(PY) benchmarks/bench_trainer.py
