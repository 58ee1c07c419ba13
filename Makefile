# One-command set-up. Both targets use one virtual environment, .venv:
#   make experiment  installs requirements.txt (training, evaluation, the
#                    default corpus; no TensorFlow), then runs the experiment;
#   make test        installs requirements-test.txt (that, plus PG-19's
#                    TensorFlow/TFDS and the test tools), then runs the tests.
# Each installs once, and again when its requirements files (or
# pyproject.toml) change; a stamp file in .venv records each installation.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BASE_STAMP := $(VENV)/.installed-base
TEST_STAMP := $(VENV)/.installed-test
# The package itself, editable and without dependencies (the requirements
# files pin those), once there is a pyproject.toml.
PYPROJECT := $(wildcard pyproject.toml)
INSTALL_SELF = if [ -f pyproject.toml ]; then $(PY) -m pip install --no-deps -e .; fi

.PHONY: test test-fast test-default-level lint docs experiment venv test-venv aot-venv clean test-jax010 \
	smoke-newest \
	$(addprefix test-,$(STACKS)) $(addprefix smoke-,$(STACKS))

WORKDIR ?= runs/default

$(PY):
	$(PYTHON) -m venv $(VENV)

$(BASE_STAMP): requirements.txt $(PYPROJECT) | $(PY)
	$(PY) -m pip install -r requirements.txt
	$(INSTALL_SELF)
	touch $@

# requirements-test.txt includes the other four files, so this installation
# stands for the base one too.
$(TEST_STAMP): requirements-test.txt requirements.txt requirements-pg19.txt requirements-gcs.txt \
    requirements-extras.txt $(PYPROJECT) | $(PY)
	$(PY) -m pip install -r requirements-test.txt
	$(INSTALL_SELF)
	touch $@ $(BASE_STAMP)

venv: $(BASE_STAMP)

test-venv: $(TEST_STAMP)

test: $(TEST_STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile tests

# The fast loop: every test but those marked slow (they start a process or
# train end to end; pyproject.toml registers the marker). `make test` runs all.
test-fast: $(TEST_STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile -m "not slow" tests

# Code checked by machine (pyproject.toml configures both): ruff's formatter
# and linter over the whole tree, mypy over the package. Installed into the
# test venv, where mypy sees the libraries the package imports. `ruff format
# .` lays the code out as the check wants it.
LINT_STAMP := $(VENV)/.installed-lint

$(LINT_STAMP): requirements-lint.txt $(TEST_STAMP)
	$(PY) -m pip install -r requirements-lint.txt
	touch $@

lint: $(LINT_STAMP)
	$(PY) -m ruff format --check .
	$(PY) -m ruff check .
	$(PY) -m mypy

# The docs' tables written from the declarations they list (docs/tables.py).
docs: $(BASE_STAMP)
	$(PY) docs/tables.py

# The suite compiles with JAX's jax_disable_most_optimizations (tests/conftest.py),
# users' runs at XLA's default level, whose code rounds otherwise. This leg
# runs the fast tier and every tolerance-based equivalence of two code paths
# (meshes and processes, scanned layers, chunked attention, accumulated
# steps, cached evaluation, windows of memory gradient) at the default level,
# so that their tolerances are held where users compute.
EQUIVALENCE_TESTS := tests/scale/test_sharding.py tests/model/test_scan_layers.py \
	tests/model/test_attention_chunks.py tests/training/test_grad_accum.py \
	tests/evaluation/test_eval_cache.py tests/training/test_memory_gradient.py

test-default-level: $(TEST_STAMP)
	JAX_DISABLE_MOST_OPTIMIZATIONS=0 $(PY) -m pytest -q -n 2 --dist loadfile \
		-m "not slow" tests
	JAX_DISABLE_MOST_OPTIMIZATIONS=0 $(PY) -m pytest -q -n 2 --dist loadfile -m slow \
		$(EQUIVALENCE_TESTS)

# The default experiment: train the small byte-level model on the books corpus
# (fetched and cached on first use), then evaluate it on the held-out test books.
experiment: $(BASE_STAMP)
	$(PY) train.py --config=configs/default.py --workdir=$(WORKDIR)
	$(PY) eval.py --workdir=$(WORKDIR) --split=test

# Ahead-of-time compilation for TPU and GPU targets on this CPU-only host
# (aot.py, compressive/scale/targets.py): a venv of its own, .venv-aot, with
# requirements-aot.txt (requirements.txt plus libtpu, the CUDA 12 plugin and
# cuDNN; several GiB), so that .venv stays small.
AOT_VENV := .venv-aot
AOT_PY := $(AOT_VENV)/bin/python
AOT_STAMP := $(AOT_VENV)/.installed-aot

$(AOT_PY):
	$(PYTHON) -m venv $(AOT_VENV)

$(AOT_STAMP): requirements-aot.txt requirements.txt $(PYPROJECT) | $(AOT_PY)
	$(AOT_PY) -m pip install -r requirements-aot.txt
	if [ -f pyproject.toml ]; then $(AOT_PY) -m pip install --no-deps -e .; fi
	touch $@

aot-venv: $(AOT_STAMP)

# The other supported stacks, each a Python and the pins that differ from
# requirements*.txt, in one file per stack: requirements-jax011.txt (JAX 0.11,
# the GPU image's) and requirements-jax012.txt (the newest JAX). A stack's venv,
# .venv-STACK, gets every pin of requirements-test.txt (and the files it
# includes) except the names its own file pins, then its own pins, then the
# package editable:
#   make test-STACK    the stack's tests (TESTS_STACK below; TESTS=... chooses)
#   make smoke-STACK   a few minutes of it: SMOKE_TESTS
# `make test` is the first stack: JAX 0.10.2 on Python 3.11, in .venv.
# JAX 0.11 and newer need Python >= 3.12: python3.12 on PATH, else pyenv's.
PYTHON312 ?= $(firstword $(shell python3.12 -c 'import sys; print(sys.executable)' 2>/dev/null) \
	$(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3.12) python3.12)
STACKS := jax011 jax012
TESTS_jax011 := tests/model/test_model.py tests/model/test_memory.py \
	tests/model/test_attention.py tests/model/test_attention_chunks.py \
	tests/training/test_train.py tests/training/test_never_idle.py
TESTS_jax012 := tests
SMOKE_TESTS := tests/model/test_model.py tests/model/test_memory.py \
	tests/model/test_attention.py tests/training/test_train.py \
	tests/training/test_never_idle.py tests/tools/test_entry_points.py

.venv-%/bin/python:
	$(PYTHON312) -m venv .venv-$*

.venv-%/.installed: requirements-%.txt requirements-test.txt requirements.txt \
		requirements-pg19.txt requirements-gcs.txt requirements-extras.txt $(PYPROJECT) \
		| .venv-%/bin/python
	pinned=$$(sed -n 's/==.*//p' requirements-$*.txt | paste -sd'|'); \
	grep -hvE "^(-r |($$pinned)==)" requirements.txt requirements-pg19.txt \
		requirements-gcs.txt requirements-extras.txt requirements-test.txt \
		| cat - requirements-$*.txt \
		> .venv-$*/requirements.txt
	.venv-$*/bin/python -m pip install -r .venv-$*/requirements.txt
	.venv-$*/bin/python -m pip install --no-deps -e .
	touch $@

# The newest releases pyproject.toml's ranges admit (JAX and its libraries
# have lower bounds only): what `pip install .` gives a new Python 3.12
# environment on the day it runs, with the test tools' pins. CI runs
# smoke-newest, so that a JAX release that breaks the package fails CI
# instead of a user's install; it prints the versions it tested first.
TEST_TOOLS := pytest hypothesis pytest-xdist execnet
.venv-newest/.installed: pyproject.toml requirements-test.txt | .venv-newest/bin/python
	grep -E "^($$(echo $(TEST_TOOLS) | tr ' ' '|'))==" requirements-test.txt \
		> .venv-newest/tools.txt
	.venv-newest/bin/python -m pip install --upgrade -r .venv-newest/tools.txt -e .
	touch $@

smoke-newest: .venv-newest/.installed
	.venv-newest/bin/python -m pip list --format=freeze 2>/dev/null \
		| grep -iE "^(jax|jaxlib|flax|optax|orbax-checkpoint|grain)=="
	.venv-newest/bin/python -m pytest -q -n 2 --dist loadfile $(SMOKE_TESTS)

# Kept between runs (make would delete them as intermediate files).
.PRECIOUS: .venv-%/bin/python .venv-%/.installed

test-jax010: test

$(addprefix test-,$(STACKS)): test-%: .venv-%/.installed
	.venv-$*/bin/python -m pytest -q -n 2 --dist loadfile $(or $(TESTS),$(TESTS_$*))

$(addprefix smoke-,$(STACKS)): smoke-%:
	$(MAKE) test-$* TESTS="$(SMOKE_TESTS)"

clean:
	rm -rf $(VENV) $(AOT_VENV) $(addprefix .venv-,$(STACKS)) .venv-newest
