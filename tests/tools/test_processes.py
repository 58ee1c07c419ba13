"""The tests' processes (tests/processes.py): a command forked from the
server behaves to the test as a new interpreter's would (exit status,
output, folder, environment, signals, the interpreter's exit), JAX
variables reach the child as JAX's options, and a command it does not fork
(switched off, another environment) starts a new interpreter."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

import processes

# Slow: every test starts processes.
pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent("""
    import os, sys
    print("argv", sys.argv[1:], "cwd", os.getcwd(), "var", os.environ.get("ZYGOTE_TEST"))
    print("preloaded", "jax" in sys.modules and "compressive.training.loop" in sys.modules)
    print("to stderr", file=sys.stderr)
    if sys.argv[1:] == ["wait"]:
      sys.stdout.flush()
      sys.stdin.read()
    if sys.argv[1:2] == ["jax"]:
      import jax
      name = sys.argv[2]  # a state is an attribute, a plain flag is read
      print("option",
            getattr(jax.config, name) if hasattr(jax.config, name) else jax.config.read(name))
    if sys.argv[1:] == ["exit"]:  # the interpreter's exit: threads joined, then atexit
      import atexit, threading, time
      atexit.register(lambda: print("atexit"))
      threading.Thread(target=lambda: (time.sleep(0.5), print("thread"))).start()
    if sys.argv[1:] == ["raise"]:
      raise ValueError("raised")
    sys.exit(int(os.environ.get("ZYGOTE_EXIT", "0")))
    """)


@pytest.fixture
def script(tmp_path):
  path = tmp_path / "child.py"
  path.write_text(SCRIPT)
  return str(path)


KW = dict(capture_output=True, text=True, timeout=120)


def run(script, *args, **kwargs):
  return processes.run([sys.executable, script, *args], **KW, **kwargs)


def test_a_forked_child_is_a_process_as_python_starts_it(script, tmp_path):
  env = dict(os.environ, ZYGOTE_TEST="here", ZYGOTE_EXIT="3")
  r = run(script, "a", "b", cwd=str(tmp_path), env=env)
  assert r.returncode == 3, r.stderr
  lines = r.stdout.splitlines()
  assert lines[0] == f"argv ['a', 'b'] cwd {tmp_path} var here"
  assert lines[1] == "preloaded True"  # forked from the server, which imported them
  assert r.stderr == "to stderr\n"


def test_a_forked_child_takes_signals_and_reports_them(script):
  p = processes.start(
    [sys.executable, script, "wait"],
    stdin=subprocess.PIPE,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  assert p.stdout.readline().startswith("argv ['wait']")
  p.send_signal(signal.SIGTERM)
  p.communicate(timeout=60)
  assert p.returncode == -signal.SIGTERM


@pytest.mark.parametrize(
  "variable",
  ["JAX_DEBUG_NANS", "JAX_DISABLE_MOST_OPTIMIZATIONS"],  # a state, a flag
)
def test_a_jax_variable_reaches_the_forked_child_as_jax_reads_it(script, variable):
  option = variable.lower()
  value = os.environ.get(variable, "0").lower() not in ("1", "true")  # the other one
  r = run(script, "jax", option, env=dict(os.environ, **{variable: "1" if value else "0"}))
  assert r.returncode == 0, r.stderr
  lines = r.stdout.splitlines()
  assert lines[1] == "preloaded True" and lines[-1] == f"option {value}"


def test_a_forked_child_ends_as_the_interpreter_does(script):
  r = run(script, "exit")
  assert r.returncode == 0 and r.stdout.splitlines()[-2:] == ["thread", "atexit"], r
  r = run(script, "raise")
  assert r.returncode == 1 and r.stderr.splitlines()[-1] == "ValueError: raised", r
  assert r.stderr.splitlines()[0] == "to stderr" and "Traceback" in r.stderr
  r = processes.run([sys.executable, "-c", "import sys; sys.exit('a message')"], **KW)
  assert (r.returncode, r.stderr) == (1, "a message\n")
  r = processes.run(
    [sys.executable, "-m", "json.tool", "--sort-keys"], input='{"b": 1, "a": 2}', **KW
  )
  assert r.returncode == 0 and r.stdout.split() == ["{", '"a":', "2,", '"b":', "1", "}"], r


def test_disabled_and_unforkable_commands_start_a_new_interpreter(script, monkeypatch):
  with processes.disabled():
    r = run(script)
  assert r.returncode == 0 and r.stdout.splitlines()[1] == "preloaded False", r.stderr
  # A library variable the server imported with differs: a new interpreter.
  r = run(script, env=dict(os.environ, PYTHONHASHSEED="7"))
  assert r.returncode == 0 and r.stdout.splitlines()[1] == "preloaded False", r.stderr
  # A JAX variable that is no option of JAX's, or one the command removes.
  r = run(script, env=dict(os.environ, JAX_NO_SUCH_OPTION="1"))
  assert r.returncode == 0 and r.stdout.splitlines()[1] == "preloaded False", r.stderr
  monkeypatch.setenv(processes.SWITCH, "0")
  r = run(script)
  assert r.returncode == 0 and r.stdout.splitlines()[1] == "preloaded False", r.stderr
