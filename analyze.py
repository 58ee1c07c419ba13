"""Analyse a trained workdir (attention, loss by position, recall): `python
analyze.py` in a checkout runs the same tool as `python -m compressive.analyze`
from anywhere. The tool, its flags and its --help are compressive/analyze.py."""

import runpy

if __name__ == "__main__":
  runpy.run_module("compressive.analyze", run_name="__main__")
