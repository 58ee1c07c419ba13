"""Train a SentencePiece model on a config's training split: `python
train_tokenizer.py` in a checkout runs the same tool as `python -m
compressive.train_tokenizer` from anywhere. The tool, its flags and its --help
are compressive/train_tokenizer.py."""

import runpy

if __name__ == "__main__":
  runpy.run_module("compressive.train_tokenizer", run_name="__main__")
