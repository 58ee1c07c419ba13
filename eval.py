"""Evaluate a training workdir or an export: `python eval.py` in a checkout runs
the same tool as `python -m compressive.eval` from anywhere. The tool, its
flags and its --help are compressive/eval.py."""

import runpy

if __name__ == "__main__":
  runpy.run_module("compressive.eval", run_name="__main__")
