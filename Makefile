# Two entry points for a fresh machine: `make demo` and `make test`.
# Both create .venv/ (Python >= 3.10) and install kvres with everything it needs into it.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.kvres-installed

.PHONY: install demo test lint typecheck unit fuzz bench clean prometheus-check dashboard-shot system-deps peers

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[all,dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/kvres demo

lint: $(STAMP)
	$(BIN)/ruff check .

# mypy sees the folders as the packages they install as (kvres.policy, ...), strict over all five.
TYPECHECK := build/typecheck
typecheck: $(STAMP)
	rm -rf $(TYPECHECK) && mkdir -p $(TYPECHECK)/kvres
	for d in policy coldstore actors cluster testing; do ln -s ../../../$$d $(TYPECHECK)/kvres/$$d; done
	cd $(TYPECHECK) && ../../$(BIN)/mypy --config-file ../../pyproject.toml \
		-p kvres.policy -p kvres.coldstore -p kvres.actors -p kvres.cluster -p kvres.testing

# PYTHONFAULTHANDLER: a crash, even one after pytest's summary (interpreter exit), prints every
# thread's Python stack.
unit: $(STAMP) system-deps
	PYTHONFAULTHANDLER=1 $(BIN)/pytest

# Debian's redis-server: the head-restart tests run Ray's GCS fault tolerance against it. Installed
# with apt-get where missing (the tests then fail saying so if that was impossible).
system-deps:
	@command -v redis-server >/dev/null 2>&1 || [ -x /usr/bin/redis-server ] || \
		{ echo "installing Debian's redis-server for the head-restart tests"; \
		  (apt-get update -qq && apt-get install -y -qq redis-server) >/dev/null 2>&1 || \
		  echo "could not install redis-server (apt-get install -y redis-server): the head-restart tests will fail"; }

test: lint typecheck unit

# The longer random run (not part of `make test`, whose property tests draw from fixed seeds): every
# test file that uses hypothesis, with random seeds and ten times the examples (tests/hypothesis_profiles.py).
# A failure prints its @reproduce_failure blob; the next `make fuzz` replays it first (.hypothesis/).
FUZZ_TESTS = $(shell grep -rlE '^from hypothesis' tests --include='test_*.py' | sort)
fuzz: $(STAMP)
	KVRES_HYPOTHESIS_PROFILE=fuzz PYTHONFAULTHANDLER=1 $(BIN)/pytest --timeout=3600 $(FUZZ_TESTS)

bench: $(STAMP)
	$(BIN)/python -m benchmarks.plan_scaling
	$(BIN)/python -m benchmarks.coldstore

# Operator checks against a live local cluster (not part of `make test`): they install Debian's
# prometheus / chromium with apt-get when missing and write their results into docs/.
# CHECK_ARGS=--scrape-only: no Prometheus, the metrics endpoint's text read as Prometheus scrapes it
# (what the check does by itself where no prometheus binary can be installed).
prometheus-check: $(STAMP)
	$(BIN)/python scripts/prometheus_check.py $(CHECK_ARGS)

dashboard-shot: $(STAMP)
	$(BIN)/python scripts/dashboard_screenshot.py

# The peer a user would pick instead of kvres, for `benchmarks.serve --peer llama-server` and
# `benchmarks.fleet --http` (docs/serving.md; not part of `make test`): llama-server built once, Release,
# CPU (ggml's defaults, -march=native as llama-cpp-python's own build), from the llama.cpp that the sdist
# of the pinned llama-cpp-python vendors (the engine code kvres runs), cached as
# build/peers/llama-server-<pin>. The web UI is left out (no download); PEER_JOBS=1 by default: a shared
# 2-core machine took ~30 min.
LLAMA_PIN    := $(shell sed -n 's/^LLAMA_CPP_PYTHON = "\(.*\)"$$/\1/p' actors/pins.py)
PEERS        := build/peers
PEER_SRC     := $(PEERS)/src-$(LLAMA_PIN)
LLAMA_SERVER := $(PEERS)/llama-server-$(LLAMA_PIN)
PEER_JOBS    ?= 1

peers: $(LLAMA_SERVER)

$(LLAMA_SERVER): | $(STAMP)
	@test -n "$(LLAMA_PIN)" || { echo "no LLAMA_CPP_PYTHON pin found in actors/pins.py"; exit 1; }
	rm -rf $(PEER_SRC) && mkdir -p $(PEER_SRC)
	$(BIN)/python -m pip download --quiet --no-binary :all: --no-deps --dest $(PEER_SRC) \
		llama-cpp-python==$(LLAMA_PIN)
	tar -xzf $(PEER_SRC)/llama_cpp_python-$(LLAMA_PIN).tar.gz -C $(PEER_SRC)
	cmake -S $(PEER_SRC)/llama_cpp_python-$(LLAMA_PIN)/vendor/llama.cpp -B $(PEER_SRC)/build \
		-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_SERVER=ON \
		-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_OPENSSL=OFF \
		-DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
	cmake --build $(PEER_SRC)/build --config Release --target llama-server -j $(PEER_JOBS)
	cp $(PEER_SRC)/build/bin/llama-server $@.tmp && mv $@.tmp $@
	rm -rf $(PEER_SRC)

clean:
	rm -rf $(VENV) build *.egg-info benchmarks/results
