"""Compile a step for hardware this machine does not have, and say whether it
fits: `python aot.py` in a checkout runs the same tool as `python -m
compressive.aot` from anywhere. The tool, its flags and its --help are
compressive/aot/__main__.py."""

import runpy

if __name__ == "__main__":
  runpy.run_module("compressive.aot", run_name="__main__")
