# One-command set-up: `make test` builds .venv from requirements.txt (once,
# again when requirements.txt changes) and runs the test suite.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: test venv clean

$(VENV)/.installed: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -r requirements.txt
	touch $@

venv: $(VENV)/.installed

test: venv
	$(PY) -m pytest -q tests

clean:
	rm -rf $(VENV)
