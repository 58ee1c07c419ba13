"""Evaluation with its own memory: whole documents streamed through the model.

Evaluation never touches the training memory: it builds a fresh memory with
the sizes of `Experiment.eval` (config.eval, resolved; the paper evaluates
with longer memories than it trains with, e.g. enwik8 n_cm 1152 -> 3072)
and streams every document of a split, start to end, through it.

Metrics: `loss` (nats per predicted token), `bits_per_token`, `bits_per_byte`
(nats / ln 2 over the UTF-8 bytes of the predicted text; for the bytes
tokenizer the bytes predicted), and for PG-19, after a complete pass (not cut
short by max_segments), `word_perplexity`: exp(total nats / words), whatever
the tokenizer. `words` is the count by whitespace of the original texts; on
the validation and test splits the normaliser is the official total instead,
`words_official` (data.pg19.OFFICIAL_WORDS: 3,007,061 and 6,966,499 words),
and a count more than 0.5% off it is a warning naming both (docs/PAPER.md
§Metrics).

Evaluation runs on the config's device mesh like training: rows split along
the data axes (the batch is padded with empty rows to a multiple of that
split), parameters laid out by the partition rules, and each process reads
only its own rows.

`stream` is the one loop over a split's segments: `evaluate` (eval.py, and
training's periodic estimates) sums its losses, and compressive/evaluation/analysis.py
reads its per-token losses and attention weights. `init_carry` and
`run_model` (compressive/evaluation/carry.py) are evaluation's only uses of
the model's key/value cache, position keys, call and aux. In `model.eval()`
mode the model computes no reconstruction loss: only training reads it.
`Progress` (compressive/evaluation/progress.py) is a stream's progress line.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Iterator, Optional, cast

from flax import nnx
import flax.struct
import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from compressive import data as data_lib
from compressive import experiment as experiment_lib
from compressive.evaluation.carry import Carry, init_carry, run_model
from compressive.evaluation.pass_metrics import pass_metrics
from compressive.evaluation.progress import Progress
from compressive.model import losses
from compressive.model import memory as memory_lib
from compressive.model.transformer import CompressiveTransformer, merge_params
from compressive.scale import sharding

# -- The carry on the mesh (compressive/evaluation/carry.py: the model in evaluation). --


def carry_shardings(mesh: Mesh, mesh_config: sharding.MeshConfig, carry: Carry) -> Carry:
  """The memory's rows split like the batch; the position keys replicated."""
  # A Carry of shardings, the tree jit's out_shardings takes, where the
  # dataclass types its fields as arrays.
  return Carry(
    sharding.memory_shardings(mesh, mesh_config, carry.memory),
    None if carry.position_keys is None else cast(Any, sharding.replicated(mesh)),
  )


# -- Streaming evaluation. --------------------------------------------------------


@flax.struct.dataclass
class Segment:
  """One segment of every row, as `stream` yields it; B rows, T tokens, L
  layers, K = C + M + T keys of [compressed memory; memory; segment].

  `batch` holds the global arrays the step read, rows split along the data
  axes; the other arrays are replicated, readable in every process. The
  optional ones are None unless `stream` was asked for them.
  """

  batch: dict[str, jax.Array]  # inputs, targets, mask [B, T]; start_of_sequence [B]
  nats: jax.Array  # [] float32: the loss summed over the predicted tokens
  count: jax.Array  # [] float32: the tokens predicted (mask True)
  nll: Optional[jax.Array] = None  # [B, T] float32 nats of each token (per_token)
  correct: Optional[jax.Array] = None  # [B, T] bool: argmax is the target (per_token)
  # [L, B, K] each layer's attention weight on each key, mean over heads
  # and queries (collect_attention).
  attention_by_key: Optional[jax.Array] = None
  # [B, C + M] bool: the [compressed memory; memory] slots that held
  # something when the segment attended to them (the same in every layer).
  memory_valid: Optional[jax.Array] = None
  # [L, B, C, d] the compressed memory the segment attended (probe).
  compressed_slots: Optional[jax.Array] = None
  # [L, B, H, T, C] each head's and query's weight on each compressed slot (probe).
  compressed_weights: Optional[jax.Array] = None


def make_stream_step(
  model: CompressiveTransformer,
  mesh: Optional[Mesh] = None,
  mesh_config: Optional[sharding.MeshConfig] = None,
  abstract_memory: Optional[memory_lib.Memory] = None,
  *,
  cache_keys_values: bool = True,
  collect_attention: bool = False,
  per_token: bool = False,
  segment_length: Optional[int] = None,
  probe: bool = False,
) -> tuple[
  Callable[[memory_lib.Memory], Carry],
  Callable[[Carry, dict[str, jax.Array]], tuple[Carry, dict[str, jax.Array]]],
]:
  """(init, step): init(memory) -> carry (`Carry`), what a stream starts
  from; step(carry, batch) -> (carry, outputs), outputs the `Segment` fields
  but the batch. Both jitted; segments have `segment_length` tokens (default
  the model's).

  With a mesh (and its MeshConfig's partition rules), the parameters are stored
  on it as training stores them and gathered along the data axes to
  compute; the carry's rows are split like the batch (`abstract_memory`
  gives its shapes) and the outputs are replicated.
  """
  graphdef, template = nnx.split(model)
  params = nnx.to_pure_dict(template)
  init, step, param_shardings = stream_functions(
    graphdef,
    template,
    mesh,
    mesh_config,
    abstract_memory,
    cache_keys_values=cache_keys_values,
    collect_attention=collect_attention,
    per_token=per_token,
    segment_length=segment_length,
    probe=probe,
  )
  if param_shardings is not None:
    params = jax.device_put(params, param_shardings)
  return (lambda memory: init(params, memory)), (lambda carry, batch: step(params, carry, batch))


def stream_functions(
  graphdef: nnx.GraphDef[CompressiveTransformer],
  template: nnx.State,
  mesh: Optional[Mesh] = None,
  mesh_config: Optional[sharding.MeshConfig] = None,
  abstract_memory: Optional[memory_lib.Memory] = None,
  *,
  cache_keys_values: bool = True,
  collect_attention: bool = False,
  per_token: bool = False,
  segment_length: Optional[int] = None,
  probe: bool = False,
) -> tuple[Any, jax.stages.Wrapped, Any]:
  """`make_stream_step`'s jitted functions with the parameters (a pure dict)
  as their first argument, and where the parameters are stored (None without
  a mesh): (init(params, memory), step(params, carry, batch), shardings).
  Shapes suffice to lower them (aot.py compiles `step` for other hardware)."""
  gathered = carries = out_shardings = param_shardings = None
  model = nnx.merge(graphdef, template)
  model.eval()  # deterministic, and no reconstruction loss, whatever mode it came in
  graphdef, template = nnx.split(model)
  t = segment_length or model.config.segment_length
  if mesh is not None:
    assert mesh_config is not None, "a mesh comes with its MeshConfig"
    param_shardings, gathered, carries, out_shardings = _stream_shardings(
      graphdef, template, mesh, mesh_config, abstract_memory, cache_keys_values, t
    )

  def merged(params: dict[str, Any]) -> CompressiveTransformer:
    if gathered is not None:
      params = jax.lax.with_sharding_constraint(params, gathered)
    return merge_params(graphdef, template, params)

  @functools.partial(jax.jit, out_shardings=carries)
  def init(params: dict[str, Any], memory: memory_lib.Memory) -> Carry:
    return init_carry(merged(params), memory, cache_keys_values, t)

  @functools.partial(jax.jit, out_shardings=out_shardings, donate_argnums=(1,))
  def step(
    params: dict[str, Any], carry: Carry, batch: dict[str, jax.Array]
  ) -> tuple[Carry, dict[str, jax.Array]]:
    carry, logits, attention = run_model(merged(params), carry, batch, collect_attention, probe)
    nats, count = losses.cross_entropy(logits, batch["targets"], batch["mask"])
    outputs = dict(nats=nats, count=count, **(attention or {}))
    if per_token:
      logp = jax.nn.log_softmax(logits, -1)
      outputs["nll"] = -jnp.take_along_axis(logp, batch["targets"][..., None], -1)[..., 0]
      outputs["correct"] = jnp.argmax(logits, -1) == batch["targets"]
    return carry, outputs

  return init, step, param_shardings


def _stream_shardings(
  graphdef: nnx.GraphDef[CompressiveTransformer],
  template: nnx.State,
  mesh: Mesh,
  mesh_config: sharding.MeshConfig,
  abstract_memory: Optional[memory_lib.Memory],
  cache_keys_values: bool,
  t: int,
) -> tuple[Any, Any, Carry, Any]:
  """`stream_functions`' layout on a mesh: (where the parameters are
  stored, the parameters gathered along the data axes to compute, the
  carry's shardings, the step's out_shardings: the carry's, and its outputs
  replicated)."""
  specs = sharding.param_specs(mesh_config, template)
  param_shardings = sharding.shardings(mesh, specs)
  gathered = sharding.shardings(mesh, sharding.gathered_specs(mesh_config, specs))
  abstract_carry = jax.eval_shape(
    lambda p, m: init_carry(merge_params(graphdef, template, p), m, cache_keys_values, t),
    nnx.to_pure_dict(template),
    abstract_memory,
  )
  carries = carry_shardings(mesh, mesh_config, abstract_carry)
  return param_shardings, gathered, carries, (carries, sharding.replicated(mesh))


def make_eval_step(
  model: CompressiveTransformer,
  mesh: Optional[Mesh] = None,
  mesh_config: Optional[sharding.MeshConfig] = None,
  abstract_memory: Optional[memory_lib.Memory] = None,
  *,
  cache_keys_values: bool = True,
) -> tuple[
  Callable[[memory_lib.Memory], Carry],
  Callable[[Carry, dict[str, jax.Array]], tuple[Carry, jax.Array, jax.Array]],
]:
  """(init, step): `make_stream_step`'s, but step(carry, batch) -> (carry,
  nats, count): the loss alone, as the benchmarks time it."""
  init, step = make_stream_step(
    model, mesh, mesh_config, abstract_memory, cache_keys_values=cache_keys_values
  )

  def loss_step(carry: Carry, batch: dict[str, jax.Array]) -> tuple[Carry, jax.Array, jax.Array]:
    carry, outputs = step(carry, batch)
    return carry, outputs["nats"], outputs["count"]

  return init, loss_step


def stream_shapes(
  experiment: experiment_lib.Experiment, mesh: Mesh, num_documents: Optional[int] = None
) -> tuple[int, int, Callable[[], memory_lib.Memory]]:
  """(B, T, init): a stream's rows and segment length at the evaluation
  sizes (`experiment.eval`), and init() -> its fresh memory. B is the eval
  batch size, at most `num_documents`, rounded up to a multiple of the
  data-parallel split (the extra rows are all padding)."""
  sizes, cfg = experiment.eval, experiment.model
  b, t = sizes.batch_size, sizes.segment_length
  if num_documents is not None:
    b = min(b, num_documents)
  dp = sharding.data_parallel_size(experiment.mesh, mesh)
  b = -(-b // dp) * dp
  init = lambda: memory_lib.init_memory(
    cfg,
    b,
    jnp.dtype(cfg.dtype),
    memory_length=sizes.memory_length,
    compressed_memory_length=sizes.compressed_memory_length,
  )
  return b, t, init


def segment_shardings(mesh: Mesh, mesh_config: sharding.MeshConfig) -> dict[str, Any]:
  """Where one segment's batch lives: rows along the data axes."""
  return {
    k: sharding.rows_sharding(mesh, mesh_config, n, 0)
    for k, n in (("inputs", 2), ("targets", 2), ("mask", 2), ("start_of_sequence", 1))
  }


def stream(
  model: CompressiveTransformer,
  documents: data_lib.Documents,
  experiment: experiment_lib.Experiment,
  *,
  max_segments: Optional[int] = None,
  mesh: Optional[Mesh] = None,
  collect_attention: bool = False,
  per_token: bool = False,
  probe: bool = False,
  progress_every_s: float = 10.0,
  what: str = "eval",
) -> Iterator[Segment]:
  """Streams `documents` through `model` with a fresh evaluation memory,
  yielding each `Segment` as soon as its step is dispatched (reading its
  arrays waits for it).

  Every document runs start to end in one row (global row r reads documents
  r, r + B, ...; SegmentIterator), with the sizes of `experiment.eval`. B is at
  most the number of documents, rounded up to a multiple of the data-parallel
  split (the extra rows are all padding).

  Args:
    experiment: the checked Experiment (config.check, training=False).
    max_segments: stop after this many segments per row (a quick periodic
      estimate during training); None or <= 0 streams the whole split.
    mesh: where to run; default the experiment's mesh over all devices. In a
      multi-process run every process calls this, reading its own rows.
    collect_attention: fill Segment.attention_by_key and memory_valid.
    per_token: fill Segment.nll and correct.
    probe: fill Segment.compressed_slots, compressed_weights and memory_valid.
    progress_every_s: seconds between progress lines (`Progress`), which
      are labelled `what`.
  """
  mc = experiment.mesh
  model.eval()
  mesh = sharding.make_mesh(mc) if mesh is None else mesh
  b, t, init = stream_shapes(experiment, mesh, len(documents))
  it = _local_segments(documents, experiment, mesh, b, t)
  carry, step = _stream_start(
    model, mesh, mc, init, t, collect_attention=collect_attention, per_token=per_token, probe=probe
  )
  batch_shardings = segment_shardings(mesh, mc)
  total = it.num_batches
  assert total is not None  # repeat=False: one pass
  limit = max_segments if max_segments and max_segments > 0 else None
  progress = Progress(what, total if limit is None else min(total, limit), b * t, progress_every_s)
  segments = 0
  for local in it:
    batch = {
      k: sharding.global_array(batch_shardings[k], v, (b,) + v.shape[1:]) for k, v in local.items()
    }
    carry, outputs = step(carry, batch)
    segments += 1
    progress.update(segments)
    yield Segment(batch=batch, **outputs)
    if limit is not None and segments >= limit:
      return


def _local_segments(
  documents: data_lib.Documents,
  experiment: experiment_lib.Experiment,
  mesh: Mesh,
  b: int,
  t: int,
) -> data_lib.SegmentIterator:
  """`stream`'s segments of B rows and T tokens, one pass, as this process
  reads them: its own rows of each [B, T] batch (the rows split along the
  data axes). Global row r reads documents r, r + B, ..., each start to end."""
  rows = sharding.rows_sharding(mesh, experiment.mesh, 2, 0)  # [B, T]
  row_start, num_rows = sharding.local_rows(rows, (b, t), axis=0)
  return data_lib.SegmentIterator(
    documents,
    batch_size=b,
    segment_length=t,
    seed=experiment.train.seed,
    repeat=False,
    row_start=row_start,
    num_rows=num_rows,
    vocab_size=experiment.model.vocab_size,
    source=experiment.data.source,
  )


def _stream_start(
  model: CompressiveTransformer,
  mesh: Mesh,
  mesh_config: sharding.MeshConfig,
  init: Callable[[], memory_lib.Memory],
  t: int,
  *,
  collect_attention: bool,
  per_token: bool,
  probe: bool,
) -> tuple[Carry, Callable[[Carry, dict[str, jax.Array]], tuple[Carry, dict[str, jax.Array]]]]:
  """`stream`'s step (`make_stream_step` on the mesh, for segments of t
  tokens, filling the optional `Segment` fields asked for) and the carry it
  starts from: the fresh memory init() makes, its rows laid out on the mesh."""
  abstract_memory = jax.eval_shape(init)
  start, step = make_stream_step(
    model,
    mesh,
    mesh_config,
    abstract_memory,
    collect_attention=collect_attention,
    per_token=per_token,
    segment_length=t,
    probe=probe,
  )
  memory = jax.jit(
    init, out_shardings=sharding.memory_shardings(mesh, mesh_config, abstract_memory)
  )()
  return start(memory), step


def evaluate(
  model: CompressiveTransformer,
  documents: data_lib.Documents,
  experiment: experiment_lib.Experiment,
  *,
  max_segments: Optional[int] = None,
  mesh: Optional[Mesh] = None,
  progress_every_s: float = 10.0,
  split: Optional[str] = None,
  stop: Optional[Callable[[], bool]] = None,
) -> Optional[dict[str, float]]:
  """The metrics of `documents` streamed through `model` (`stream`, whose
  arguments these are) with a fresh evaluation memory. In a multi-process
  run every process calls this and gets the same result. `stop`, asked at
  every segment's boundary: when it says so the pass is dropped (None).

  `split` names the split `documents` hold (default experiment.eval.split): a
  complete pass over PG-19's validation or test split reports
  `word_perplexity` over the official word total (`word_perplexity_of`).
  The metrics are `pass_metrics`' (compressive/evaluation/pass_metrics.py).
  """
  split = experiment.eval.split if split is None else split
  source = data_lib.registry.get(experiment.data.source)
  # A source's published word total, held to its contract before the pass.
  official = data_lib.registry.official_words(experiment.data.source, source, split)
  total_nats, total_tokens, segments = 0.0, 0.0, 0
  pending = []  # read every 64 segments: reading waits for the device
  for segment in stream(
    model,
    documents,
    experiment,
    max_segments=max_segments,
    mesh=mesh,
    progress_every_s=progress_every_s,
  ):
    if stop is not None and stop():
      return None
    pending.append((segment.nats, segment.count))
    segments += 1
    if len(pending) >= 64:
      total_nats += sum(float(n) for n, _ in pending)
      total_tokens += sum(float(c) for _, c in pending)
      pending = []
  total_nats += sum(float(n) for n, _ in pending)
  total_tokens += sum(float(c) for _, c in pending)
  complete = not (max_segments and max_segments > 0 and segments >= max_segments)
  return pass_metrics(
    total_nats, total_tokens, complete, documents, experiment, split, official, source
  )
