"""Peer benchmark worker: lucidrains' compressive-transformer-pytorch 0.4.0.

Runs INSIDE the peer venv (benchmarks/peer_env.sh builds it); it never imports
jax. benchmarks/compare_peer.py starts it and talks to it over stdin/stdout:
one command a line in, one JSON object a line out.

  warmup N   N training updates, then N evaluation segments, untimed (fills
             the memories: the peer's memories grow from empty, so steady
             state needs 1 + cmem_len / (mem_len / rate) = 5 segments)
  train N    N optimizer updates, each on one segment of batch x seq_len
             random bytes, memories threaded across updates; timed
  eval N     N segments of forward-only streaming (model.eval(),
             torch.inference_mode()), memories threaded; timed
  info       model, versions, threads
  quit

Reply: {"cmd", "n", "seconds", "tokens", "tokens_per_second",
"compile_or_first_step_s", "peak_rss_mib", ...}; errors as {"error": ...}.
Tokens count batch x seq_len per optimizer update / per eval segment.

The reference config (issue #6): vocab 256, dim 512, depth 8, heads 8,
ff mult 4 (d_ff 2048), seq_len = mem_len = cmem_len = 256, cmem_ratio 4,
plain residual (gru_gated_residual=False), fp32, batch 4. Everything else is
the library default (memory_layers: all, enhanced_recurrence=True, no dropout,
reconstruction_loss_weight=1). Training is the library's own recipe (its
enwik8 example): cross-entropy + the model's aux (attention-reconstruction)
loss, backward, Adam. Gradient clipping by global norm 0.5 matches ours.

Standalone: `$PEER_VENV/bin/python benchmarks/peer_pytorch.py` and type
commands, or `--selftest` for a tiny config smoke test.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
import warnings

from compressive_transformer_pytorch import CompressiveTransformer
import torch
import torch.nn.functional as F

REFERENCE = dict(
  num_tokens=256,
  dim=512,
  depth=8,
  heads=8,
  seq_len=256,
  mem_len=256,
  cmem_len=256,
  cmem_ratio=4,
  gru_gated_residual=False,
)
# d_ff = dim * 4 is hard-coded in the library's FeedForward (mult=4).


def peak_rss_mib() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Peer:
  def __init__(
    self, batch_size: int, model_kwargs: dict, lr: float, clip: float, kv_grad: bool, seed: int = 0
  ):
    torch.manual_seed(seed)
    self.model = CompressiveTransformer(**model_kwargs)
    self.model_kwargs = model_kwargs
    self.b, self.t, self.v = batch_size, model_kwargs["seq_len"], model_kwargs["num_tokens"]
    self.clip = clip
    self.kv_grad = kv_grad
    if kv_grad:
      # Ablation: SelfAttention.forward calls `self.to_kv.weight.detach_()` in
      # training, which sets requires_grad=False on the K/V projection for
      # good (from the first segment with memory on, to_kv is never trained
      # and its weight gradient never computed). Make that call a no-op so
      # to_kv trains as in ours (its aux-loss gradient then reaches to_kv too).
      for layer in self.model.attn_layers:
        w = layer.fn.fn.to_kv.weight
        w.detach_ = (lambda w: lambda: w)(w)  # noqa: B023  (w bound by the outer call)
    self.opt = torch.optim.Adam(self.model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    self.batches = [torch.randint(0, self.v, (self.b, self.t + 1), generator=gen) for _ in range(8)]
    self.train_mem = None
    self.eval_mem = None
    self.i = 0
    self.first_step_s = None
    self.last_losses = None

  def _batch(self):
    self.i += 1
    return self.batches[self.i % len(self.batches)]

  def train_step(self):
    self.model.train()
    x = self._batch()
    logits, self.train_mem, aux_loss = self.model(x[:, :-1], memories=self.train_mem)
    lm_loss = F.cross_entropy(logits.transpose(1, 2), x[:, 1:])
    loss = lm_loss + aux_loss
    loss.backward()
    if self.clip > 0:
      torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
    self.opt.step()
    self.opt.zero_grad(set_to_none=True)
    self.last_losses = (float(lm_loss), float(aux_loss))

  def eval_step(self):
    self.model.eval()
    x = self._batch()
    with torch.inference_mode():
      logits, self.eval_mem, _ = self.model(x[:, :-1], memories=self.eval_mem)
      nats = F.cross_entropy(logits.transpose(1, 2), x[:, 1:], reduction="sum")
    return float(nats)

  def timed(self, fn, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
      fn()
    return time.perf_counter() - start

  def handle(self, cmd: str, n: int) -> dict:
    if cmd == "info":
      return self.info()
    if cmd == "warmup":
      start = time.perf_counter()
      self.train_step()
      self.first_step_s = time.perf_counter() - start
      self.timed(self.train_step, max(n - 1, 0))
      self.timed(self.eval_step, n)
      out = dict(cmd=cmd, n=n, seconds=time.perf_counter() - start)
    elif cmd in ("train", "eval"):
      if self.first_step_s is None:  # no warmup: time the first step apart
        start = time.perf_counter()
        self.train_step() if cmd == "train" else self.eval_step()
        self.first_step_s = time.perf_counter() - start
      seconds = self.timed(self.train_step if cmd == "train" else self.eval_step, n)
      tokens = n * self.b * self.t
      out = dict(cmd=cmd, n=n, seconds=seconds, tokens=tokens, tokens_per_second=tokens / seconds)
      if cmd == "train" and self.last_losses:
        out["lm_loss"], out["aux_loss"] = self.last_losses
        to_kv = self.model.attn_layers[0].fn.fn.to_kv
        out["to_kv_requires_grad"] = bool(to_kv.weight.requires_grad)
    else:
      raise ValueError(f"unknown command {cmd!r}")
    mem = self.train_mem if cmd != "eval" else self.eval_mem
    if mem is not None:
      out["memory_lengths"] = [int(mem.mem.shape[2]), int(mem.compressed_mem.shape[2])]
    out["compile_or_first_step_s"] = self.first_step_s
    out["peak_rss_mib"] = peak_rss_mib()
    return out

  def info(self) -> dict:
    from importlib.metadata import version

    params = sum(p.numel() for p in self.model.parameters())
    kv = self.model.attn_layers[0].fn.fn.to_kv.weight
    return dict(
      cmd="info",
      torch=torch.__version__,
      compressive_transformer_pytorch=version("compressive-transformer-pytorch"),
      threads=torch.get_num_threads(),
      interop_threads=torch.get_num_interop_threads(),
      model=self.model_kwargs,
      batch_size=self.b,
      num_params=params,
      optimizer=dict(name="Adam", lr=self.opt.param_groups[0]["lr"], clip=self.clip),
      reconstruction_loss_weight=self.model.reconstruction_loss_weight,
      enhanced_recurrence=self.model.enhanced_recurrence,
      kv_grad_patch=self.kv_grad,
      to_kv_requires_grad=bool(kv.requires_grad),
      mkldnn=torch.backends.mkldnn.is_available(),
      cpu_affinity=sorted(os.sched_getaffinity(0)),
      peak_rss_mib=peak_rss_mib(),
    )


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--threads", type=int, default=2)
  p.add_argument("--batch-size", type=int, default=4)
  p.add_argument("--lr", type=float, default=1e-4)
  p.add_argument("--clip", type=float, default=0.5, help="global-norm clip; 0 = none")
  p.add_argument(
    "--kv-grad",
    action="store_true",
    help="ablation: undo the library's to_kv.weight.detach_() (see Peer)",
  )
  p.add_argument("--selftest", action="store_true", help="tiny config, a few steps, exit")
  args = p.parse_args(argv)

  torch.set_num_threads(args.threads)
  warnings.filterwarnings("ignore")  # detach_ on a leaf, numpy missing: noise on stdout's peer
  model_kwargs = dict(REFERENCE)
  if args.selftest:
    model_kwargs.update(dim=64, depth=2, heads=4, seq_len=16, mem_len=16, cmem_len=16)
  peer = Peer(args.batch_size, model_kwargs, args.lr, args.clip, args.kv_grad)

  if args.selftest:
    for line in ("info", "warmup 6", "train 3", "eval 3"):
      cmd, *n = line.split()
      print(json.dumps(peer.handle(cmd, int(n[0]) if n else 0)), flush=True)
    return 0

  print(json.dumps(dict(cmd="ready", peak_rss_mib=peak_rss_mib())), flush=True)
  for line in sys.stdin:
    parts = line.split()
    if not parts:
      continue
    if parts[0] == "quit":
      break
    try:
      out = peer.handle(parts[0], int(parts[1]) if len(parts) > 1 else 0)
    except Exception as e:
      out = dict(cmd=parts[0], error=f"{type(e).__name__}: {e}")
    print(json.dumps(out), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
