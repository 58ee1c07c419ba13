"""Train a Compressive Transformer: `python train.py` in a checkout runs the same
tool as `python -m compressive.train` from anywhere. The tool, its flags and
its --help are compressive/train.py."""

import runpy

if __name__ == "__main__":
  runpy.run_module("compressive.train", run_name="__main__")
