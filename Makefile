# elmo-cli: `make demo` and `make test` are all a fresh machine needs.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
# The CPU build of torch. On these machines pip finds this exact release as a local wheel; elsewhere it comes
# from PyTorch's CPU index. Never let pip resolve plain `torch`, which pulls a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu

.PHONY: install demo test bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH_SPEC)" || $(BIN)/pip install -q "$(TORCH_SPEC)" --index-url $(TORCH_INDEX)
	$(BIN)/pip install -q -e ".[test]"
	touch $@

test: install
	$(BIN)/python -m pytest

demo: install
	bash examples/demo.sh

bench: install
	$(BIN)/python -m benchmarks.run

clean:
	rm -rf $(VENV) demo-out bench-out
