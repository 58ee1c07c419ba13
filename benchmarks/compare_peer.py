"""Side-by-side benchmark: ours (JAX) against lucidrains'
compressive-transformer-pytorch 0.4.0 (PyTorch), at the reference config.

  bash benchmarks/peer_env.sh && .venv/bin/python benchmarks/compare_peer.py

Runs in our venv. Starts benchmarks/peer_pytorch.py in the peer venv
(PEER_VENV, default ~/.cache/compressive/peer-venv) as a subprocess, builds
ours in this process, then interleaves rounds -- ours train, theirs train,
ours eval, theirs eval -- so both see the same machine conditions; while one
runs the other waits (the peer blocked on stdin). Both use --threads CPU
threads (the process is pinned to that many CPUs when the machine has more;
the peer inherits the pinning and calls torch.set_num_threads).

Tokens are counted alike: batch x segment_length per optimizer update
(training; ours does --segments-per-step updates per jitted step) and per
segment (streaming evaluation). Per-round figures go to stderr; the last line
of stdout is one JSON object: median tokens/s over rounds for each side and
ratios ours / theirs (also the best round's, less sensitive to other load on
a shared machine), per-round figures, environment and config.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_PEER_VENV = os.path.join(os.path.expanduser("~"), ".cache", "compressive", "peer-venv")


def log(msg: str) -> None:
  print(msg, file=sys.stderr, flush=True)


def die(msg: str, code: int = 2):
  print(f"compare_peer: error: {msg}", file=sys.stderr, flush=True)
  sys.exit(code)


def pin_threads(threads: int) -> list[int]:
  """Pin this process (and so the peer) to `threads` CPUs if it has more:
  XLA's CPU thread pool is sized by the CPUs the process may run on."""
  cpus = sorted(os.sched_getaffinity(0))
  if len(cpus) > threads:
    cpus = cpus[:threads]
    os.sched_setaffinity(0, cpus)
  return cpus


def loadavg() -> list[float]:
  return [round(x, 2) for x in os.getloadavg()]


def cpu_model() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor()


class PeerProcess:
  """The peer worker: one command line in, one JSON line out."""

  def __init__(self, python: str, args: list[str], threads: int):
    env = dict(
      os.environ,
      OMP_NUM_THREADS=str(threads),
      MKL_NUM_THREADS=str(threads),
      PYTHONWARNINGS="ignore",
    )
    env.pop("PYTHONPATH", None)
    self.proc = subprocess.Popen(
      [python, os.path.join(HERE, "peer_pytorch.py"), "--threads", str(threads), *args],
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      stderr=sys.stderr,
      text=True,
      bufsize=1,
      env=env,
    )
    self.ready = self._read()

  def _read(self) -> dict:
    while True:
      line = self.proc.stdout.readline()
      if not line:
        die(f"peer worker exited (code {self.proc.wait()}); see its stderr above")
      line = line.strip()
      if line.startswith("{"):
        try:
          return json.loads(line)
        except json.JSONDecodeError:
          pass
      log(f"[peer] {line}")

  def __call__(self, cmd: str, n: int = 0) -> dict:
    self.proc.stdin.write(f"{cmd} {n}\n")
    self.proc.stdin.flush()
    out = self._read()
    if "error" in out:
      die(f"peer {cmd} {n}: {out['error']}")
    return out

  def close(self):
    if self.proc.poll() is None:
      try:
        self.proc.stdin.write("quit\n")
        self.proc.stdin.flush()
        self.proc.wait(timeout=30)
      except (BrokenPipeError, subprocess.TimeoutExpired):
        self.proc.kill()


def _arguments(argv: "list[str] | None") -> argparse.Namespace:
  """The command line, parsed and checked (one line and exit 2 when bad)."""
  p = argparse.ArgumentParser(
    description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
  )
  p.add_argument("--rounds", type=int, default=3)
  p.add_argument(
    "--train-updates",
    type=int,
    default=8,
    help="optimizer updates per side per round (a multiple of --segments-per-step)",
  )
  p.add_argument("--eval-segments", type=int, default=8, help="eval segments per side per round")
  p.add_argument(
    "--segments-per-step",
    type=int,
    default=4,
    help="ours: segments (= optimizer updates) per jitted train step",
  )
  p.add_argument(
    "--warmup",
    type=int,
    default=6,
    help="peer: untimed updates and eval segments first (its memories grow from "
    "empty and are full after 5 segments)",
  )
  p.add_argument("--threads", type=int, default=2)
  p.add_argument("--peer-venv", default=os.environ.get("PEER_VENV", DEFAULT_PEER_VENV))
  p.add_argument(
    "--peer-kv-grad",
    action="store_true",
    help="ablation: undo the peer library's to_kv.weight.detach_() so its K/V "
    "projections train (see peer_pytorch.py)",
  )
  args = p.parse_args(argv)
  if args.train_updates % args.segments_per_step:
    die(
      f"--train-updates {args.train_updates} is not a multiple of "
      f"--segments-per-step {args.segments_per_step}"
    )
  return args


def _environment(args: argparse.Namespace, peer_info: dict, cpus, load_start) -> dict:
  """The result's `environment`: both sides' libraries and threads, the
  machine, and its load at the start and the end."""
  import jax

  return dict(
    jax=jax.__version__,
    jax_backend=jax.default_backend(),
    torch=peer_info["torch"],
    compressive_transformer_pytorch=peer_info["compressive_transformer_pytorch"],
    threads=args.threads,
    torch_threads=peer_info["threads"],
    cpus=cpus,
    cpu_count=os.cpu_count(),
    cpu_model=cpu_model(),
    python=platform.python_version(),
    load_average_start=load_start,
    load_average_end=loadavg(),
    xla_flags=os.environ.get("XLA_FLAGS", ""),
  )


def _configs(args: argparse.Namespace, config, peer_info: dict, last_train: dict) -> dict:
  """The result's `config`: the reference model, each side's model,
  batch and optimizer as it reports them, and the rounds' sizes."""
  return dict(
    reference=dict(
      vocab=256,
      d_model=512,
      layers=8,
      heads=8,
      d_ff=2048,
      segment=256,
      memory=256,
      compressed_memory=256,
      rate=4,
      batch=4,
      dtype="float32",
    ),
    ours=dict(
      model=config.model.to_dict(),
      batch_size=config.batch_size,
      segments_per_step=config.segments_per_step,
      optimizer=config.optimizer.to_dict(),
    ),
    theirs=dict(
      model=peer_info["model"],
      batch_size=peer_info["batch_size"],
      optimizer=peer_info["optimizer"],
      enhanced_recurrence=peer_info["enhanced_recurrence"],
      reconstruction_loss_weight=peer_info["reconstruction_loss_weight"],
      kv_grad_patch=peer_info["kv_grad_patch"],
      to_kv_requires_grad_after_training=last_train.get("to_kv_requires_grad"),
    ),
    rounds=args.rounds,
    train_updates_per_round=args.train_updates,
    eval_segments_per_round=args.eval_segments,
    peer_warmup=args.warmup,
  )


def main(argv=None) -> int:
  args = _arguments(argv)

  peer_python = os.path.join(args.peer_venv, "bin", "python")
  if not os.access(peer_python, os.X_OK):
    die(
      f"peer venv missing: no {peer_python}; build it with `bash benchmarks/peer_env.sh` "
      "(or set PEER_VENV / --peer-venv)"
    )

  cpus = pin_threads(args.threads)
  load_start = loadavg()
  log(f"threads {args.threads}, cpus {cpus}, load average {load_start}")

  # Peer first: it starts in seconds; then warm it up while ours is not built.
  t0 = time.perf_counter()
  peer = PeerProcess(peer_python, ["--kv-grad"] if args.peer_kv_grad else [], args.threads)
  try:
    peer_info = peer("info")
    log(
      f"peer: torch {peer_info['torch']}, {peer_info['num_params'] / 1e6:.2f}M params, "
      f"threads {peer_info['threads']}, started in {time.perf_counter() - t0:.1f}s"
    )
    warm = peer("warmup", args.warmup)
    log(
      f"peer warmup ({args.warmup} updates + {args.warmup} eval segments): "
      f"{warm['seconds']:.1f}s, first step {warm['compile_or_first_step_s']:.2f}s"
    )

    import jax

    sys.path.insert(0, HERE)
    import common

    config = common.reference_config("ct", segments_per_step=args.segments_per_step)
    ours_train = common.TrainBench(config)
    ours_eval = common.EvalBench(config)
    tokens_per_step = ours_train.tokens_per_step
    segment_tokens = config.batch_size * config.model.segment_length
    if config.batch_size != peer_info["batch_size"] or (
      config.model.segment_length != peer_info["model"]["seq_len"]
    ):
      die("batch or segment length differs between ours and the peer")

    def first(bench, n) -> float:
      """Compile + first call, minus the timed part of it."""
      start = time.perf_counter()
      tps = bench.run(1)
      return time.perf_counter() - start - n / tps

    ours_train_first = first(ours_train, tokens_per_step)
    ours_eval_first = first(ours_eval, segment_tokens)
    log(
      f"ours: jax {jax.__version__}, {ours_train.num_params / 1e6:.2f}M params; compile + "
      f"first step: train {ours_train_first:.1f}s, eval {ours_eval_first:.1f}s"
    )

    rounds = []
    steps = args.train_updates // args.segments_per_step
    for r in range(args.rounds):
      row = dict(round=r + 1, load=loadavg()[0])
      row["ours_train"] = ours_train.run(steps)
      row["theirs_train"] = peer("train", args.train_updates)["tokens_per_second"]
      row["ours_eval"] = ours_eval.run(args.eval_segments)
      peer_eval = peer("eval", args.eval_segments)
      row["theirs_eval"] = peer_eval["tokens_per_second"]
      rounds.append(row)
      log(
        f"round {r + 1}/{args.rounds} (load {row['load']}): train tok/s ours "
        f"{row['ours_train']:.0f} theirs {row['theirs_train']:.0f} "
        f"(x{row['ours_train'] / row['theirs_train']:.2f}); eval tok/s ours "
        f"{row['ours_eval']:.0f} theirs {row['theirs_eval']:.0f} "
        f"(x{row['ours_eval'] / row['theirs_eval']:.2f})"
      )
    last_train = peer("train", 1)
  finally:
    peer.close()

  med = {
    k: statistics.median(r[k] for r in rounds)
    for k in ("ours_train", "theirs_train", "ours_eval", "theirs_eval")
  }
  best = {k: max(r[k] for r in rounds) for k in med}
  flops = common.flops_per_token(common.ModelConfig.from_config(config.model), config.batch_size)

  def speeds(stat):
    return {
      p: dict(ours=round(stat[f"ours_{p}"], 1), theirs=round(stat[f"theirs_{p}"], 1))
      for p in ("train", "eval")
    }

  def ratios(stat):
    return {p: round(stat[f"ours_{p}"] / stat[f"theirs_{p}"], 3) for p in ("train", "eval")}

  result = dict(
    benchmark="compare_peer",
    tokens_per_second=speeds(med),
    ratio_ours_over_theirs=ratios(med),
    # Best round of each side: less sensitive to other jobs' load bursts.
    best_tokens_per_second=speeds(best),
    best_ratio_ours_over_theirs=ratios(best),
    rounds=[
      {k: (round(v, 1) if isinstance(v, float) else v) for k, v in r.items()} for r in rounds
    ],
    tokens_counted="batch x segment_length per optimizer update (train) / per segment (eval)",
    compile_or_first_step_s=dict(
      ours_train=round(ours_train_first, 2),
      ours_eval=round(ours_eval_first, 2),
      theirs=round(warm["compile_or_first_step_s"], 2),
    ),
    peak_rss_mib=dict(
      ours=round(common.peak_rss_mib(), 1), theirs=round(last_train["peak_rss_mib"], 1)
    ),
    num_params=dict(ours=ours_train.num_params, theirs=peer_info["num_params"]),
    ours_model_gflops_per_s=dict(
      train=round(med["ours_train"] * flops.train / 1e9, 1),
      eval=round(med["ours_eval"] * flops.forward / 1e9, 1),
    ),
    environment=_environment(args, peer_info, cpus, load_start),
    config=_configs(args, config, peer_info, last_train),
  )
  print(json.dumps(result, default=str))
  return 0


if __name__ == "__main__":
  sys.exit(main())
