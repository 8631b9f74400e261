# ckptbench: `make bench` runs the default suite for this machine (suites/gpu-small.toml where torch sees
# CUDA, else suites/cpu.toml; SUITE=... names one) and writes an HTML report; `make test` runs the tests.
# Both create .venv and install what they need first.  On a CUDA machine pass a CUDA torch build:
#   make bench TORCH='torch==2.13.0 --index-url https://download.pytorch.org/whl/cu130'
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
SUITE ?=
RUN ?= $(if $(SUITE),$(basename $(notdir $(SUITE)))-$(shell date +%Y%m%d-%H%M%S))
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install test test-all bench docs lint perf gpu-check clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

# the tests in one process per core (pytest-xdist), a test module's tests in one process (its fixtures once); the 15 slowest listed.
# `make test` leaves out the tests marked slow (each ten seconds or more, its subject also checked by a test that
# stays; a grid keeps a sample holding every value of every axis); `make test-all`, what CI runs, runs every test
TEST_WORKERS ?= auto
PYTEST := $(PY) -m pytest -n $(TEST_WORKERS) --dist loadscope --durations=15
test: $(STAMP)
	$(PYTEST) -m "not slow"

test-all: $(STAMP)
	$(PYTEST)

# the documentation site (docs/, mkdocs-material) into site/; --strict: a broken link or a page missing
# from the navigation fails the build
DOCS_STAMP := $(VENV)/.docs-installed
$(DOCS_STAMP): $(STAMP)
	$(PY) -m pip install -q -c constraints.txt -e '.[dev,docs]'
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict -q

bench: $(STAMP)
	$(PY) -m ckptbench sweep $(if $(SUITE),--suite $(SUITE)) $(if $(RUN),--out results/$(RUN) --report reports/$(RUN).html)

# Train-step benchmarks (pytest-benchmark, tests/benchmarks/); compare two with `python -m ckptbench compare`.
perf: $(STAMP)
	mkdir -p results
	$(PY) -m pytest tests/benchmarks --benchmark-only --benchmark-json=results/perf-$$(date +%Y%m%d-%H%M%S).json

# The GPU check on a CUDA machine, with that machine's own python3 and packages (no venv, no network):
# time-boxed gpu-small sweep, calibration, report, summary; everything lands in OUT.
OUT ?= results/gpu-check-$(shell date +%Y%m%d-%H%M%S)
gpu-check:
	bash scripts/gpu_check.sh $(OUT)

lint: $(STAMP)
	$(PY) -m ruff check ckptbench tests

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache site
