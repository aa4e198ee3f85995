# One target per thing CI does; `make test` is what .ci/run calls.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: install services test-deps lint typecheck docs unit test chaos demo bench release clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

services:
	bash scripts/services.sh

# the system tools some tests need (chromium, chromium-driver, promtool, faketime,
# docker-compose): apt-get installs the missing ones when run as root; otherwise it says how
test-deps:
	bash scripts/test-deps.sh

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install
	$(BIN)/mypy

# the documentation site; --strict turns a broken link or anchor into a failure
docs: install
	$(BIN)/mkdocs build --strict -q

unit: install
	$(BIN)/pytest tests/unit -q -p no:cacheprovider

# pytest exits 5 when it collects nothing: make fails then, so CI never passes on nothing.
# The long chaos runs (marked `chaos`: kill -9, SIGTERM, Redis crashes, thousands of jobs)
# are `make chaos`; CI (.ci/run) runs both.
test: install services test-deps lint typecheck docs
	$(BIN)/python scripts/check_layering.py
	$(BIN)/pytest tests/unit tests/compat tests/integration tests/acceptance tests/packaging -m "not chaos" -p no:cacheprovider --durations=15

chaos: install services
	$(BIN)/pytest tests/integration tests/acceptance -m chaos -p no:cacheprovider

demo: install
	$(BIN)/python scripts/demo.py $(DEMO_ARGS)

# benchmarks (never part of `make test`): BENCH_ARGS="--quick" or sections, e.g. "drain peers"
bench: install services
	$(BIN)/python -m pip install -q -e '.[dev,bench]'
	$(BIN)/python -m bench $(BENCH_ARGS)

# a release's sdist and wheel, built from its tag (git archive), never the working tree:
# make release TAG=v0.1.0 -> dist/v0.1.0/ with SHA256SUMS
release: install
	$(BIN)/python scripts/release.py build $(TAG)

clean:
	rm -rf .demo build *.egg-info .mypy_cache .ruff_cache
