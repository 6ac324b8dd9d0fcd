# Two commands matter: `make bench` and `make test`. Each installs what it needs first.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Reinstall when the packaging or the compiled simulator loop (setup.py) changes.
COMPILED := setup.py harness/simulate/native_sources.py \
  $(shell $(PYTHON) harness/simulate/native_sources.py)
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml $(COMPILED) | sha256sum | cut -c1-12)
RUNTIME ?= llamacpp
URL ?=
BENCH_ARGS ?=
PYTEST_ARGS ?=

.DEFAULT_GOAL := help
.PHONY: help setup llama vllm sglang dynamo browser bench test test-unit lint perf clean

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-9s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml $(COMPILED)
	@bash adapters/launchers/install_c_compiler.sh $(PYTHON)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[dev,distributed]"
	@rm -f $(VENV)/.installed-*
	@touch $@

setup: $(STAMP) ## Install Python dependencies into .venv (idempotent)

llama: ## Build llama-server once (cached) and fetch the default model
	@bash adapters/launchers/install_llamacpp.sh >/dev/null
	@bash adapters/launchers/fetch_model.sh >/dev/null

vllm: ## Install CPU vLLM once into its own cached virtualenv and make the tiny local model
	@py=$$(bash adapters/launchers/install_vllm.sh | tail -1) && \
	  "$$py" adapters/launchers/make_tiny_model.py >/dev/null

sglang: ## Install CPU SGLang (pinned, sgl_kernel stand-in) once into its own cached virtualenv and make the tiny model
	@py=$$(bash adapters/launchers/install_sglang.sh) && "$$py" adapters/launchers/make_tiny_model.py \
	  >/dev/null || { echo "error: the CPU SGLang setup failed (install_sglang.sh: pinned sglang" \
	  "without its CUDA-only requirements, unsupported upstream); see the lines above" >&2; exit 1; }

dynamo: ## Install NVIDIA Dynamo (frontend + mocker workers) once into its own cached virtualenv and make the tiny model's config
	@py=$$(bash adapters/launchers/install_dynamo.sh | tail -1) && \
	  "$$py" adapters/launchers/make_tiny_model.py --no-weights >/dev/null

bench: setup ## Replay the shipped trace under the runtime's policies on a local server (RUNTIME=llamacpp|vllm|sglang|dynamo; openai needs URL)
ifeq ($(URL),)
	@$(MAKE) --no-print-directory $(if $(filter vllm sglang dynamo,$(RUNTIME)),$(RUNTIME),llama)
	$(BIN)/harness bench --runtime $(RUNTIME) $(BENCH_ARGS)
else
	$(BIN)/harness bench --runtime $(RUNTIME) --url $(URL) $(BENCH_ARGS)
endif

browser: ## Debian's headless Chromium for the report-rendering test (skipped without it)
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	  && (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) \
	  >/dev/null 2>&1 || echo "note: chromium not installed; the report-rendering test will skip"; }

test: setup llama vllm sglang dynamo browser lint ## Lint, then unit, conformance and live tests (real llama-server, vLLM, SGLang and Dynamo)
	$(BIN)/pytest $(PYTEST_ARGS)

test-unit: setup ## Unit and conformance tests only: no servers, no runtime installs, no lint
	$(BIN)/pytest tests/unit tests/conformance -m "not live" $(PYTEST_ARGS)

# mypy checks the package as it is installed: adapters/ is harness.adapters (pyproject's
# package-dir), which mypy cannot map, so it reads a view of symbolic links, build/typecheck/.
TYPECHECK := build/typecheck

lint: setup ## ruff, and mypy --strict on harness/ and adapters/ (as harness.adapters)
	$(BIN)/ruff check harness adapters tests benchmarks
	@rm -rf $(TYPECHECK) && mkdir -p $(TYPECHECK)/harness && \
	  for f in harness/*; do ln -s "$$PWD/$$f" $(TYPECHECK)/harness/; done && \
	  ln -s "$$PWD/adapters" $(TYPECHECK)/harness/adapters
	cd $(TYPECHECK) && $(CURDIR)/$(BIN)/mypy --strict --config-file $(CURDIR)/pyproject.toml harness

perf: setup ## Performance benchmarks with their targets (every one runs; exit 1 if any missed)
	@failed=""; for b in benchmarks/bench_*.py; do echo "== $$b"; \
	  $(BIN)/python $$b || failed="$$failed $$b"; done; \
	  if [ -n "$$failed" ]; then echo "targets missed:$$failed"; exit 1; fi

clean: ## Remove the virtualenv, caches and results (not the cached llama-server build)
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis build *.egg-info \
	  harness/simulate/*.so harness/simulate/native_build.json
	find reports -mindepth 1 -maxdepth 1 ! -name README.md ! -name baseline -exec rm -rf {} +
