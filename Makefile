# SeamlessFlow — the two commands a new user needs: `make demo` and `make test`.
# Each installs what it needs on a fresh machine (.venv, Kafka jars, DeepSpeed's CPU build) and
# stops the processes it started.

PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev
JARS := infra/kafka/lib/.resolved
OPS := .cache/torch_extensions/.built
export TORCH_EXTENSIONS_DIR := $(CURDIR)/.cache/torch_extensions
export DS_ACCELERATOR := cpu
export TOKENIZERS_PARALLELISM := false
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: help install jars packages test test-fast lint demo up down bench clean

help:
	@echo "make demo   - run the main job (installs and starts what it needs, stops it after)"
	@echo "make test   - run the test suite against a real Kafka broker started for the session"
	@echo "make up / make down - start / stop the local Kafka stack"
	@echo "make bench  - run the benchmarks under bench/"

# What a run needs (`make demo`); the tests, linters and agent frameworks come on top (`make test`).
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel
	$(PIP) install -q -e .
	# DeepSpeed ships an sdist that imports torch while building: install it after torch.
	$(PIP) install -q --no-build-isolation 'deepspeed>=0.14'
	@touch $@

$(DEV_STAMP): $(STAMP)
	$(PIP) install -q -e '.[dev,frameworks,examples]'
	@touch $@

# DeepSpeed's CPU ops are JIT-built on first use (~1 min); built here, a first train step does not pay for it.
$(OPS): $(STAMP)
	$(PY) -c "from trainer_svc.engine import build_cpu_ops; build_cpu_ops()"
	@touch $@

install: $(STAMP) $(OPS)

$(JARS): infra/kafka/pom.xml
	mvn -q -B -f infra/kafka/pom.xml dependency:copy-dependencies
	@touch $@

jars: $(JARS)

# Debian packages the tests use: Prometheus (tests/e2e/test_prometheus.py) and a headless browser
# (tests/analytics/test_dashboard_browser.py). Installed when missing; a test whose program is still
# missing skips, saying why (tests/system_packages.py).
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo -n)
DEBIAN_PACKAGES := prometheus chromium chromium-driver
APT_INSTALL := $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends
packages:
	@command -v prometheus >/dev/null && command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  { $(APT_INSTALL) $(DEBIAN_PACKAGES) >/dev/null 2>&1 || { $(SUDO) apt-get update -q >/dev/null 2>&1 && \
	  $(APT_INSTALL) $(DEBIAN_PACKAGES) >/dev/null 2>&1; } || \
	  echo "Debian packages $(DEBIAN_PACKAGES) not installed (needs apt and root): their tests will skip"; }

lint: $(DEV_STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy schemas bus infra agents_adapter inference_svc scheduler_svc trainer_svc examples

test: $(DEV_STAMP) $(OPS) $(JARS) packages
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -m "not gpu" --durations=30 tests

test-fast: $(DEV_STAMP) $(JARS)
	$(PY) -m pytest -m "unit" tests

up: $(STAMP) $(JARS)
	$(VENV)/bin/sflow up

down:
	@test -x $(VENV)/bin/sflow && $(VENV)/bin/sflow down || true

# The setup phases are timed here and handed to the job, which prints them with its own at the end.
now_ms = $$(($$(date +%s%N) / 1000000))
demo:
	@t0=$(now_ms); $(MAKE) --no-print-directory install; t1=$(now_ms); $(MAKE) --no-print-directory jars; \
	t2=$(now_ms); SFLOW_SETUP_PHASES="install=$$(((t1 - t0) / 1000)).$$(((t1 - t0) % 1000 / 100)),jars=$$(((t2 - t1) / 1000)).$$(((t2 - t1) % 1000 / 100))" \
	$(PY) -m infra.demo

# Servers the benches start, not benches themselves.
BENCH_SERVERS := bench/proxy_floor.py bench/fake_upstream.py
bench: $(DEV_STAMP) $(JARS)
	$(PIP) install -q -e '.[peers]'  # the peers bench/vs_gateways.py and bench/vs_trl.py measure against
	@for b in $(filter-out $(BENCH_SERVERS),$(wildcard bench/*.py)); do echo "== $$b"; $(PY) $$b || exit 1; done

clean: down
	rm -rf var runs .pytest_cache .mypy_cache .ruff_cache
