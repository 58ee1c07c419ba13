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

.PHONY: test experiment venv test-venv clean

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
	$(PY) -m pytest -q tests

# The default experiment: train the small byte-level model on the books corpus
# (fetched and cached on first use), then evaluate it on the held-out test books.
experiment: $(BASE_STAMP)
	$(PY) train.py --config=configs/default.py --workdir=$(WORKDIR)
	$(PY) eval.py --workdir=$(WORKDIR) --split=test

clean:
	rm -rf $(VENV)
