"""The tests' process server (tests/zygote.py): a command it forks behaves
to the test as a new interpreter's would (exit status, output, folder,
environment, signals), JAX variables reach the child as JAX's options, and
it steps aside when it cannot serve (switched off, another Python, a
command it does not fork)."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

import zygote

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
    sys.exit(int(os.environ.get("ZYGOTE_EXIT", "0")))
    """)


@pytest.fixture
def script(tmp_path):
  path = tmp_path / "child.py"
  path.write_text(SCRIPT)
  return str(path)


def run(script, *args, **kwargs):
  return subprocess.run(
    [sys.executable, script, *args], capture_output=True, text=True, timeout=120, **kwargs
  )


@pytest.mark.skipif(not zygote.usable(), reason="the server is off here (zygote.usable)")
def test_a_forked_child_is_a_process_as_python_starts_it(script, tmp_path):
  env = dict(os.environ, ZYGOTE_TEST="here", ZYGOTE_EXIT="3")
  r = run(script, "a", "b", cwd=str(tmp_path), env=env)
  assert r.returncode == 3, r.stderr
  lines = r.stdout.splitlines()
  assert lines[0] == f"argv ['a', 'b'] cwd {tmp_path} var here"
  assert lines[1] == "preloaded True"  # forked from the server, which imported them
  assert r.stderr == "to stderr\n"


@pytest.mark.skipif(not zygote.usable(), reason="the server is off here (zygote.usable)")
def test_a_forked_child_takes_signals_and_reports_them(script):
  p = subprocess.Popen(
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


@pytest.mark.skipif(not zygote.usable(), reason="the server is off here (zygote.usable)")
@pytest.mark.parametrize(
  "variable, forked",
  [
    ("JAX_DEBUG_NANS", True),  # a JAX option: set in the forked child
    ("JAX_DISABLE_MOST_OPTIMIZATIONS", False),  # a flag JAX reads at import: a new interpreter
  ],
)
def test_a_jax_variable_reaches_the_child_as_jax_reads_it(script, variable, forked):
  option = variable.lower()
  value = os.environ.get(variable, "0").lower() not in ("1", "true")  # the other one
  r = run(script, "jax", option, env=dict(os.environ, **{variable: "1" if value else "0"}))
  assert r.returncode == 0, r.stderr
  lines = r.stdout.splitlines()
  assert lines[1] == f"preloaded {forked}" and lines[-1] == f"option {value}"


def test_disabled_and_unforkable_commands_start_a_new_interpreter(script):
  with zygote.disabled():
    r = run(script)
  assert r.returncode == 0 and r.stdout.splitlines()[1] == "preloaded False", r.stderr
  # A library variable the server imported with differs: a new interpreter.
  r = run(script, env=dict(os.environ, PYTHONHASHSEED="7"))
  assert r.returncode == 0 and r.stdout.splitlines()[1] == "preloaded False", r.stderr


def test_the_switch_and_the_python_version_decide_whether_it_serves(monkeypatch):
  monkeypatch.setenv(zygote.SWITCH, "0")
  assert not zygote.usable()
  monkeypatch.setenv(zygote.SWITCH, "1")
  assert zygote.usable() == (sys.version_info[:2] in zygote.PYTHONS)
  monkeypatch.setattr(zygote, "PYTHONS", ())
  assert not zygote.usable()
