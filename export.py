"""Export a workdir's parameters: `python export.py` in a checkout runs the same
tool as `python -m compressive.export` from anywhere. The tool, its flags and
its --help are compressive/export.py."""

import runpy

if __name__ == "__main__":
  runpy.run_module("compressive.export", run_name="__main__")
