# elmo-cli: `make demo` and `make test` are all a fresh machine needs.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
# The CPU build of torch. On these machines pip finds this exact release as a local wheel; elsewhere it comes
# from PyTorch's CPU index. Never let pip resolve plain `torch`, which pulls a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu

.PHONY: install demo demo-task test bench bench-quality clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH_SPEC)" || $(BIN)/pip install -q "$(TORCH_SPEC)" --index-url $(TORCH_INDEX)
	$(BIN)/pip install -q -e ".[test]"
	touch $@

test: install
	$(BIN)/python -m pytest

# The whole pipeline on the Austen demo corpus (examples/demo.sh): the `laptop` recipe for a fixed 1600 steps, then
# held-out perplexity beside 5-gram Kneser-Ney (biLM/KN5 0.895; about 6 minutes on 2 cores; examples/demo-result.txt).
demo: install
	bash examples/demo.sh

bench: install
	$(BIN)/python -m benchmarks.run

# The `laptop` recipe for 2 hours on the Austen novels, held-out perplexity at 15/30/60/120 minutes beside
# order-3 and order-5 Kneser-Ney (2 h 1 min on 2 quiet cores; writes bench-out/quality/).
bench-quality: install
	$(BIN)/python -m benchmarks.bench_quality --minutes 120 --out bench-out/quality

# ELMo in task models: the demo biLM (made by `make demo` if missing), then `task train --compare` on UD English
# EWT: UPOS tagging and 5-way genre classification (5 min 24 s after `make demo`).
demo-task: install
	bash examples/demo_task.sh

clean:
	rm -rf $(VENV) demo-out bench-out
