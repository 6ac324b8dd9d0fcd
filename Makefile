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
# The local vLLM and SGLang servers' model: tiny (random weights, the default) or smollm2
# (SmolLM2-135M-Instruct's real weights: llama.cpp's GGUF converted once to safetensors).
MODEL ?= tiny
CONVERT := adapters/launchers/convert_gguf_model.py \
  --gguf "$$(bash adapters/launchers/fetch_model.sh | tail -1)"
# What `make vllm` / `make sglang` add for MODEL=smollm2: the conversion, with the runtime's python.
SMOLLM2 = $(filter smollm2,$(MODEL))
CONVERT_STEP = "$$py" $(CONVERT) >/dev/null
# The converted folder named to the launcher (bench, pressure): made by then, so the project's
# python finds it (reusing a folder needs no torch).
MODEL_VAR_vllm := HARNESS_VLLM_MODEL
MODEL_VAR_sglang := HARNESS_SGLANG_MODEL
MODEL_ENV = $(if $(and $(SMOLLM2),$(MODEL_VAR_$(RUNTIME))),$(MODEL_VAR_$(RUNTIME))="$$($(BIN)/python $(CONVERT))" )

.DEFAULT_GOAL := help
.PHONY: help setup llama vllm sglang dynamo browser bench pressure test test-unit lint perf clean

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
	  "$$py" adapters/launchers/make_tiny_model.py >/dev/null$(if $(SMOLLM2), && $(CONVERT_STEP))

sglang: ## Install CPU SGLang (pinned, sgl_kernel stand-in) once into its own cached virtualenv and make the tiny model
	@py=$$(bash adapters/launchers/install_sglang.sh) && "$$py" adapters/launchers/make_tiny_model.py \
	  >/dev/null || { echo "error: the CPU SGLang setup failed (install_sglang.sh: pinned sglang" \
	  "without its CUDA-only requirements, unsupported upstream); see the lines above" >&2; exit 1; }$(if $(SMOLLM2),; \
	  $(CONVERT_STEP))

dynamo: ## Install NVIDIA Dynamo (frontend + mocker workers) once into its own cached virtualenv and make the tiny model's config
	@py=$$(bash adapters/launchers/install_dynamo.sh | tail -1) && \
	  "$$py" adapters/launchers/make_tiny_model.py --no-weights >/dev/null

bench: setup ## Replay the shipped trace under the runtime's policies on a local server (RUNTIME=llamacpp|vllm|sglang|dynamo; openai needs URL)
ifeq ($(URL),)
	@$(MAKE) --no-print-directory $(if $(filter vllm sglang dynamo,$(RUNTIME)),$(RUNTIME),llama)
	$(MODEL_ENV)$(BIN)/harness bench --runtime $(RUNTIME) $(BENCH_ARGS)
else
	$(BIN)/harness bench --runtime $(RUNTIME) --url $(URL) $(BENCH_ARGS)
endif

# The memory-pressure scenario: a KV pool of 2,560 tokens (vLLM: 80 usable 32-token blocks, the
# 81st is vLLM's null block; SGLang: --max-total-tokens) under the shipped trace's 6 agents and
# the `pressure` bystanders, so pinned contexts block admission and evictable ones are lost (with
# MODEL=smollm2 the `pressure-light` ones: a quarter of the rate, what a CPU serving real
# weights keeps up with, so the pool and not the server's speed is contended for).
PRESSURE_POOL_vllm := --server-arg=--num-gpu-blocks-override=81 \
  --policies keep,keep-evictable,swap,ttl,recompute
# SGLang's CPU engine cannot swap (HiCache needs CUDA): swap would be recorded unsupported and
# leave every context pinned, keep's run again.
PRESSURE_POOL_sglang := --server-arg=--max-total-tokens=2560 \
  --policies keep,keep-evictable,ttl,recompute --policy-arg ttl.after=recompute

pressure: setup ## The memory-pressure scenario on a local engine (RUNTIME=vllm|sglang): a small KV pool, bystanders, each policy's retention and its cost to others
	@test -n "$(PRESSURE_POOL_$(RUNTIME))" || { echo "error: make pressure runs RUNTIME=vllm or RUNTIME=sglang" >&2; exit 2; }
	@case "$(MODEL)" in tiny|smollm2) ;; *) echo "error: MODEL is tiny (the default) or smollm2" >&2; exit 2;; esac
	@$(MAKE) --no-print-directory $(RUNTIME)
	$(MODEL_ENV)$(BIN)/harness bench --runtime $(RUNTIME) --trace traces/bench-small.parquet \
	  --inject $(if $(SMOLLM2),pressure-light,pressure) \
	  --ctx-per-slot 2048 --first-token-timeout 120 $(PRESSURE_POOL_$(RUNTIME)) \
	  --out reports/pressure-$(RUNTIME)-$$(date -u +%Y%m%dT%H%M%SZ) $(BENCH_ARGS)

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
