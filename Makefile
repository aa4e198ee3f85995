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
	$(BIN)/pytest tests/unit -q -p no:cacheprovider -n $(TEST_WORKERS) $(XDIST)

# The suite runs in parallel (pytest-xdist), a test file to a worker (--dist loadfile: a
# module's fixtures, its workers and servers, are made once), each worker on servers of
# its own (tests/isolation.py). The tests mostly wait on real workers, servers and timers,
# so more workers than cores pays: TEST_WORKERS=4 by default, TEST_WORKERS=0 runs serially.
TEST_WORKERS  ?= 4
CHAOS_WORKERS ?= 3
XDIST = -p xdist --dist loadfile

# pytest exits 5 when it collects nothing: make fails then, so CI never passes on nothing.
# The long chaos runs (marked `chaos`: kill -9, SIGTERM, Redis crashes, thousands of jobs)
# are `make chaos`; CI (.ci/run) runs both.
test: install services test-deps lint typecheck docs
	$(BIN)/python scripts/check_layering.py
	$(BIN)/pytest tests/unit tests/compat tests/integration tests/acceptance tests/packaging -m "not chaos" -p no:cacheprovider -n $(TEST_WORKERS) $(XDIST) --durations=15

chaos: install services
	$(BIN)/pytest tests/integration tests/acceptance -m chaos -p no:cacheprovider -n $(CHAOS_WORKERS) $(XDIST) --durations=15

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
