"""Train a Compressive Transformer: `python train.py` in a checkout runs the same
tool as `python -m compressive.train` from anywhere. The tool, its flags and
its --help are compressive/train.py."""

import runpy
import signal


def _held(signum, frame):
  """Holds a stop signal (SIGTERM, SIGINT, SIGHUP, ...) that comes while the
  tool imports (JAX takes a second): compressive/training/interrupts.py
  takes them over and reports them in one line, where SIGTERM's default
  would kill the run unheard."""
  del frame
  _held.signals.append(signum)


_held.signals = []

if __name__ == "__main__":
  # errors.STOP_SIGNALS, spelled here: nothing of the package is imported yet.
  for _signum in (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGXCPU,
  ):
    signal.signal(_signum, _held)
  runpy.run_module("compressive.train", run_name="__main__")
