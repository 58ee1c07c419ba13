# One-command set-up: `make test` builds .venv from requirements.txt (once,
# again when requirements.txt changes) and runs the test suite.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: test experiment venv clean

WORKDIR ?= runs/default

$(VENV)/.installed: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -r requirements.txt
	touch $@

venv: $(VENV)/.installed

test: venv
	$(PY) -m pytest -q tests

# The default experiment: train the small byte-level model on the books corpus
# (fetched and cached on first use), then evaluate it on the held-out test books.
experiment: venv
	$(PY) train.py --config=configs/default.py --workdir=$(WORKDIR)
	$(PY) eval.py --workdir=$(WORKDIR) --split=test

clean:
	rm -rf $(VENV)
