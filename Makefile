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

.PHONY: test experiment venv test-venv aot-venv test-jax011 clean

WORKDIR ?= runs/default

$(PY):
	$(PYTHON) -m venv $(VENV)

$(BASE_STAMP): requirements.txt $(PYPROJECT) | $(PY)
	$(PY) -m pip install -r requirements.txt
	$(INSTALL_SELF)
	touch $@

# requirements-test.txt includes the other two files, so this installation
# stands for the base one too.
$(TEST_STAMP): requirements-test.txt requirements.txt requirements-pg19.txt $(PYPROJECT) | $(PY)
	$(PY) -m pip install -r requirements-test.txt
	$(INSTALL_SELF)
	touch $@ $(BASE_STAMP)

venv: $(BASE_STAMP)

test-venv: $(TEST_STAMP)

test: $(TEST_STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile tests

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

# JAX 0.11 (Python >= 3.12): the same code on the second JAX it supports, on
# CPU: the model, memory, attention and train tests (requirements-jax011.txt).
PYTHON312 ?= python3.12
J11_VENV := .venv-jax011
J11_PY := $(J11_VENV)/bin/python
J11_STAMP := $(J11_VENV)/.installed
J11_TESTS := tests/test_model.py tests/test_memory.py tests/test_attention.py \
	tests/test_attention_chunks.py tests/test_train.py tests/test_never_idle.py

$(J11_PY):
	$(PYTHON312) -m venv $(J11_VENV)

$(J11_STAMP): requirements-jax011.txt $(PYPROJECT) | $(J11_PY)
	$(J11_PY) -m pip install -r requirements-jax011.txt
	$(J11_PY) -m pip install --no-deps -e .
	touch $@

test-jax011: $(J11_STAMP)
	$(J11_PY) -m pytest -q $(J11_TESTS)

clean:
	rm -rf $(VENV) $(J11_VENV)
