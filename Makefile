# Two commands do everything on a fresh machine:
#   make demo   # set up, then run the end-to-end demo
#   make test   # set up, then run the whole test suite
# `make lab` opens JupyterLab on the tutorial notebooks.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.sbplab-installed
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_PACKAGES := $(if $(shell command -v dot),,graphviz) $(if $(wildcard /usr/bin/chromium),,chromium)

.PHONY: setup demo test test-fast lab tour bench lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@if [ -n "$(strip $(APT_PACKAGES))" ]; then \
	  echo "installing Debian packages: $(APT_PACKAGES)"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $(APT_PACKAGES); \
	fi
	[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch is pinned so a machine with a local CPU wheel uses it; elsewhere pip brings the CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[notebook,dev,test]"
	touch $(STAMP)

demo: setup
	$(PY) -m sbplab.demo

tour: setup
	$(PY) -m sbplab.tour

test: setup
	$(PY) -m pytest -q tests notebooks --nbval-lax --nbval-sanitize-with notebooks/sanitize.cfg

# the inner loop: no worker processes, browser, fault injection or slow tests (a test that starts
# workers without its `multiprocess` marker fails here)
test-fast: setup
	SBPLAB_TEST_FAST=1 $(PY) -m pytest -q tests -m "not multiprocess and not browser and not faults and not slow"

bench: setup
	for f in benchmarks/bench_*.py; do echo "== $$f"; $(PY) $$f || exit 1; done

lab: setup
	$(VENV)/bin/jupyter lab notebooks/

lint: setup
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis report.html
