"""Ahead-of-time compilation of the train and evaluation steps for hardware
this machine does not have (aot.py; docs/SCALING.md §Before renting the hardware).

The step is built exactly as training and evaluation build it (the same
`make_train_step` / `eval_lib.stream_functions`, layout and mesh), but over
the target's devices (compressive/scale/targets.py: a TPU topology or a CUDA
target description, compiled for on this CPU) and from shapes alone, so
nothing is allocated. XLA then reports what one device would hold.

Per-device bytes (`compiled.memory_analysis()`): arguments + outputs -
aliased (donated inputs reused as outputs) + temporaries + generated code.
The TPU compiler itself refuses a program over the chip's HBM; the GPU
compiler does not check, so `fits` compares the total with the device's
memory for every target alike.
"""

from __future__ import annotations

import collections
import dataclasses
import re
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp

from compressive import experiment as experiment_lib
from compressive.evaluation import evaluate as eval_lib
from compressive.scale import flops as flops_lib
from compressive.scale import sharding
from compressive.training import setup as setup_lib
from compressive.training import step as train_step

STEPS = ("train", "eval")
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


def _abstract(tree: Any, shardings: Any) -> Any:
  """ShapeDtypeStructs of `tree`'s leaves, laid out by `shardings`."""
  return jax.tree.map(
    lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings
  )


def lower_train_step(
  experiment: experiment_lib.Experiment, mesh: jax.sharding.Mesh
) -> jax.stages.Lowered:
  """The checked experiment's train step on `mesh` (training's own), lowered
  from shapes."""
  train, cfg = experiment.train, experiment.model
  setup = setup_lib.build_setup(experiment, mesh)
  layout = setup.layout
  step = train_step.make_train_step(
    setup.graphdef,
    setup.state_template,
    setup.tx,
    cfg.dropout_rate > 0,
    layout,
    grad_accum_steps=train.grad_accum_steps,
    gradient_window=train.gradient_window,
  )
  s, b, t = train.segments_per_step, train.batch_size, cfg.segment_length
  batch = {
    k: jax.ShapeDtypeStruct(shape, dt, sharding=layout.batch[k])
    for k, shape, dt in (
      ("inputs", (s, b, t), jnp.int32),
      ("targets", (s, b, t), jnp.int32),
      ("mask", (s, b, t), jnp.bool_),
      ("start_of_sequence", (s, b), jnp.bool_),
    )
  }
  return step.lower(
    _abstract(setup.abstract_state, layout.state),
    _abstract(setup.abstract_memory, layout.memory),
    batch,
  )


def lower_eval_step(
  experiment: experiment_lib.Experiment, mesh: jax.sharding.Mesh
) -> jax.stages.Lowered:
  """One segment of streaming evaluation at the config's evaluation sizes
  (eval.*: e.g. enwik8's 3,072 compressed slots), with the key/value cache,
  on `mesh`, lowered from shapes."""
  mc = experiment.mesh
  graphdef, template, abstract_params = train_step.abstract_model(experiment)
  b, t, init_memory = eval_lib.stream_shapes(experiment, mesh)
  abstract_memory = jax.eval_shape(init_memory)
  init, step, param_shardings = eval_lib.stream_functions(
    graphdef, template, mesh, mc, abstract_memory, segment_length=t
  )
  params = _abstract(abstract_params, param_shardings)
  memory = _abstract(abstract_memory, sharding.memory_shardings(mesh, mc, abstract_memory))
  carry = init.eval_shape(params, memory)
  carry = _abstract(carry, eval_lib.carry_shardings(mesh, mc, carry))
  shardings = eval_lib.segment_shardings(mesh, mc)
  batch = {
    k: jax.ShapeDtypeStruct(shape, dt, sharding=shardings[k])
    for k, shape, dt in (
      ("inputs", (b, t), jnp.int32),
      ("targets", (b, t), jnp.int32),
      ("mask", (b, t), jnp.bool_),
      ("start_of_sequence", (b,), jnp.bool_),
    )
  }
  return step.lower(params, carry, batch)


def model_flops(experiment: experiment_lib.Experiment, step: str) -> float:
  """Our count of the step's model FLOPs (compressive/scale/flops.py), all devices."""
  train, cfg = experiment.train, experiment.model
  if step == "train":
    per_token = flops_lib.flops_per_token(cfg, train.batch_size).train
    return per_token * train.segments_per_step * train.batch_size * cfg.segment_length
  sizes = experiment.eval
  model = dataclasses.replace(
    cfg,
    segment_length=sizes.segment_length,
    memory_length=sizes.memory_length,
    compressed_memory_length=sizes.compressed_memory_length,
  )
  per_token = flops_lib.flops_per_token(model, sizes.batch_size).evaluate
  return per_token * sizes.batch_size * sizes.segment_length


def _opcode(line: str) -> Optional[str]:
  """The opcode of one HLO instruction line (`%x = SHAPE opcode(...)`)."""
  _, sep, rest = line.partition(" = ")
  if not sep or not line.lstrip().startswith(("%", "ROOT")):
    return None
  if rest.startswith("("):  # a tuple shape: skip to its closing parenthesis
    depth = 0
    for i, ch in enumerate(rest):
      depth += {"(": 1, ")": -1}.get(ch, 0)
      if depth == 0:
        rest = rest[i + 1 :]
        break
  else:
    rest = rest.partition(" ")[2]
  m = re.match(r"\s*([a-z][\w-]*)\(", rest)
  return m.group(1) if m else None


def collectives(hlo_text: str) -> dict[str, int]:
  """Collective operations in a compiled program's text, by kind. An
  asynchronous one (`-start` / `-done`) counts once, and so does one inside a
  loop body (scanned layers, segments). Collectives inside fusions count
  (TPU wraps them in `async_collective_fusion`s), but TPU's fused
  reduce-scatter (a fusion of an all-reduce and its slice,
  `calls=%all-reduce-scatter...`) counts as a reduce-scatter, not as the
  all-reduce inside it."""
  fused = set(re.findall(r"calls=%(all-reduce-scatter[\w.-]*)", hlo_text))
  counts: collections.Counter = collections.Counter()
  skip = False
  for line in hlo_text.splitlines():
    head = re.match(r"^(?:ENTRY )?%([\w.-]+) ", line)
    if head and line.rstrip().endswith("{"):  # a computation starts
      skip = head.group(1) in fused
      continue
    if skip:
      continue
    op = _opcode(line)
    if op == "fusion" and re.search(r"calls=%all-reduce-scatter", line):
      counts["reduce-scatter"] += 1
    elif op is not None:
      base = op.removesuffix("-start")
      if base in COLLECTIVES and not op.endswith("-done"):
        counts[base] += 1
  return {kind: counts[kind] for kind in COLLECTIVES if counts[kind]}


@dataclasses.dataclass
class Report:
  """What aot.py prints (as JSON, `as_dict`)."""

  target: str
  step: str
  devices: int
  processes: int
  mesh: dict[str, int]
  compile_seconds: float
  per_device: dict[str, int]  # arguments, outputs, temporaries, code, total (bytes)
  device_memory_bytes: Optional[int]
  fits: Optional[bool]
  flops_per_step: Optional[float]  # XLA's, summed over devices
  model_flops_per_step: float
  step_seconds_at_40pct_mfu: Optional[float]
  collectives: dict[str, int]

  def as_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


def per_device_bytes(memory_analysis: Any) -> dict[str, int]:
  m = memory_analysis
  out = {
    "arguments": int(m.argument_size_in_bytes),
    "outputs": int(m.output_size_in_bytes),
    "aliased": int(m.alias_size_in_bytes),
    "temporaries": int(m.temp_size_in_bytes),
    "code": int(m.generated_code_size_in_bytes),
  }
  out["total"] = (
    out["arguments"] + out["outputs"] - out["aliased"] + out["temporaries"] + out["code"]
  )
  return out


def xla_flops(compiled: jax.stages.Compiled) -> Optional[float]:
  """XLA's FLOP count of one device's program, or None if not reported."""
  try:
    cost = compiled.cost_analysis()
  except Exception:  # some backends do not implement it
    return None
  if isinstance(cost, Sequence) and not isinstance(cost, dict):
    cost = cost[0] if cost else None
  value = None if not cost else cost.get("flops")
  return None if value is None or value < 0 else float(value)


def report(
  compiled: jax.stages.Compiled,
  *,
  target: str,
  step: str,
  devices: Sequence[Any],
  mesh: jax.sharding.Mesh,
  compile_seconds: float,
  device_memory_bytes: Optional[int],
  peak_flops_per_device: Optional[float],
  experiment: experiment_lib.Experiment,
) -> Report:
  memory = per_device_bytes(compiled.memory_analysis())
  per_device_flops = xla_flops(compiled)
  n = len(devices)
  model = model_flops(experiment, step)
  hlo_text = compiled.as_text()
  assert hlo_text is not None, "the compiled step has no text view on this backend"
  return Report(
    target=target,
    step=step,
    devices=n,
    processes=len({getattr(d, "process_index", 0) for d in devices}),
    mesh={k: int(v) for k, v in mesh.shape.items()},
    compile_seconds=round(compile_seconds, 1),
    per_device=memory,
    device_memory_bytes=device_memory_bytes,
    fits=None if device_memory_bytes is None else memory["total"] <= device_memory_bytes,
    flops_per_step=None if per_device_flops is None else per_device_flops * n,
    model_flops_per_step=model,
    step_seconds_at_40pct_mfu=(
      None if not peak_flops_per_device else model / (0.4 * n * peak_flops_per_device)
    ),
    collectives=collectives(hlo_text),
  )


GIB = 1024**3


def advice(
  experiment: experiment_lib.Experiment, step: str, per_device: Optional[dict[str, int]] = None
) -> str:
  """What to change when a step does not fit, from what fills the device
  (per_device None: not known, as when the TPU compiler refuses)."""
  m, train = experiment.model, experiment.train
  if per_device and per_device["arguments"] > per_device["temporaries"]:
    return (
      "the parameters and optimizer state dominate: shard them (mesh.shape with an "
      "'fsdp' axis, e.g. --config.mesh.shape='(1,8,1)') or use more devices"
    )
  if step == "eval":
    return (
      "lower eval.batch_size or eval.compressed_memory_length, or set "
      "model.attention_chunk_size (e.g. 128)"
    )
  hints = [
    f"lower batch_size (now {train.batch_size}) or raise grad_accum_steps "
    f"(now {train.grad_accum_steps})"
  ]
  if m.remat == "none":
    hints.append("set model.remat=full")
  if not m.attention_chunk_size:
    hints.append("set model.attention_chunk_size (e.g. 128)")
  return "; ".join(hints)


# libtpu's refusal: "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total
# memory required for HLO temporaries (200.00G) exceeds available HBM (15.75G)."
_HBM = re.compile(
  r"required[^(]*\(([0-9.]+)([KMGT]?)\) "
  r"exceeds available HBM \(([0-9.]+)([KMGT]?)\)"
)


def parse_out_of_memory(message: str) -> Optional[tuple[float, float]]:
  """(bytes needed, bytes available) from the TPU compiler's out-of-memory
  error, if it says."""
  m = _HBM.search(message)
  if not m:
    return None
  scale = lambda unit: 1024 ** " KMGT".index(unit or " ")
  return float(m.group(1)) * scale(m.group(2)), float(m.group(3)) * scale(m.group(4))
