"""Generate text from a trained workdir: `python sample.py` in a checkout runs the
same tool as `python -m compressive.sample` from anywhere. The tool, its flags
and its --help are compressive/sample.py."""

import runpy

if __name__ == "__main__":
  runpy.run_module("compressive.sample", run_name="__main__")
