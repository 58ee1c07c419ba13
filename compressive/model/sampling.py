"""Streaming generation with memory: prompt in, tokens out, memory bounded.

Notation: B rows, T segment length, S = C + M memory slots, K = S + T keys,
L layers, H heads, D head width.

The prompt's whole segments go through the model as in training. Tokens are
then decoded one at a time by the same model call with `position=`, over a
memory that carries cached keys and values: those of its slots (computed once,
when a slot enters it, since the weights do not change) and those of the
current segment's earlier tokens. When a segment is complete it is pushed into
the memory by one whole-segment call (which also compresses what it evicts and
caches the new slots' keys). The length of a generation is unbounded; memory
use is fixed by (S, T).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Iterator, Optional, Sequence

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from compressive.model import config as config_lib
from compressive.model import memory as memory_lib
from compressive.model.transformer import CompressiveTransformer

if TYPE_CHECKING:  # the protocol the sampler's text needs, named for the type checker only
  from compressive.data.tokenizers import Tokenizer


def check_sampling_args(num_tokens: int, temperature: float, top_k: int, top_p: float) -> None:
  """ValueError naming the argument that is out of range."""
  if (
    isinstance(num_tokens, bool) or not isinstance(num_tokens, (int, np.integer)) or num_tokens < 0
  ):
    raise ValueError(f"num_tokens={num_tokens!r} must be an integer >= 0")
  if not (
    isinstance(temperature, (int, float, np.number))
    and math.isfinite(temperature)
    and temperature >= 0
  ):
    raise ValueError(f"temperature={temperature!r} must be a finite number >= 0 (0: greedy)")
  if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 0:
    raise ValueError(f"top_k={top_k!r} must be an integer >= 0 (0: all tokens)")
  if not (isinstance(top_p, (int, float, np.number)) and 0.0 < top_p <= 1.0):
    raise ValueError(f"top_p={top_p!r} must be in (0, 1] (1: off)")


def choose(
  logits: jax.Array, rng: jax.Array, temperature: float, top_k: int, top_p: float
) -> jax.Array:
  """Next tokens [B] from logits [B, V]: greedy at temperature 0, else
  sampling restricted to the top k and to the smallest set of mass >= top_p."""
  if temperature <= 0:
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)
  logits = logits / temperature
  if top_k and top_k > 0:
    kth = jax.lax.top_k(logits, min(top_k, logits.shape[-1]))[0][:, -1:]
    logits = jnp.where(logits < kth, -jnp.inf, logits)
  if 0.0 < top_p < 1.0:
    sorted_logits = jnp.sort(logits, axis=-1)[:, ::-1]
    probs = jax.nn.softmax(sorted_logits, axis=-1)
    # Keep tokens whose preceding cumulative mass is below top_p.
    keep = jnp.cumsum(probs, axis=-1) - probs < top_p
    threshold = jnp.min(jnp.where(keep, sorted_logits, jnp.inf), axis=-1, keepdims=True)
    logits = jnp.where(logits < threshold, -jnp.inf, logits)
  return jax.random.categorical(rng, logits, axis=-1).astype(jnp.int32)


def _model_calls(
  graphdef: nnx.GraphDef[CompressiveTransformer],
) -> tuple[jax.stages.Wrapped, jax.stages.Wrapped]:
  """The sampler's two jitted calls of the model (`graphdef` with the state
  passed in): advance(state, memory, tokens [B, T]) runs a whole segment and
  pushes it into the memory, (the last position's logits [B, V], memory);
  step(state, memory, table, token [B], position) decodes one token into the
  cache (`table` the position keys), (its logits [B, V], memory)."""
  merged = lambda state: nnx.merge(graphdef, state)

  @jax.jit
  def advance(
    state: nnx.State, memory: memory_lib.Memory, tokens: jax.Array
  ) -> tuple[jax.Array, memory_lib.Memory]:
    # a whole segment, pushed into the memory
    logits, memory, _ = merged(state)(tokens, memory)
    return logits[:, -1], memory

  @jax.jit
  def step(
    state: nnx.State,
    memory: memory_lib.Memory,
    table: Optional[jax.Array],
    token: jax.Array,
    position: jax.Array,
  ) -> tuple[jax.Array, memory_lib.Memory]:
    # one token, into the cache
    logits, memory, _ = merged(state)(
      token[:, None], memory, position=position, position_keys=table
    )
    return logits[:, 0], memory

  return advance, step


class Sampler:
  """Streams tokens from a model, carrying its memory across segments.

  sampler = Sampler(model, batch_size=1)
  for token in sampler.generate(prompt_ids, 200, temperature=0.8, top_k=40):
    ...
  """

  def __init__(
    self,
    model: CompressiveTransformer,
    batch_size: int = 1,
    *,
    segment_length: Optional[int] = None,
    memory_length: Optional[int] = None,
    compressed_memory_length: Optional[int] = None,
  ) -> None:
    model.eval()
    cfg = model.config
    self.segment_length = segment_length or cfg.segment_length
    sizes = {}
    if memory_length is not None:
      sizes["memory_length"] = memory_length
    if compressed_memory_length is not None:
      sizes["compressed_memory_length"] = compressed_memory_length
    self.memory = memory_lib.init_memory(cfg, batch_size, jnp.dtype(cfg.dtype), **sizes)
    config_lib.check_segment_length(
      cfg, self.segment_length, self.memory.compressed_memory_length, "segment_length"
    )
    graphdef, state = nnx.split(model)
    self._state = state
    t = self.segment_length
    merged = lambda state: nnx.merge(graphdef, state)
    self._advance, self._step = _model_calls(graphdef)
    self.memory = jax.jit(lambda st, m: merged(st).cache_keys_values(m, t))(state, self.memory)
    self._table = jax.jit(lambda st, m: merged(st).position_keys(m, t))(state, self.memory)
    self.segment = np.zeros((batch_size, t), np.int32)  # the current segment so far
    self.position = 0
    self.logits = None  # logits after the last token fed

  def feed(self, tokens: np.ndarray) -> None:
    """Consumes tokens [B, N]: whole segments at once, the rest one by one."""
    tokens = np.asarray(tokens, np.int32)
    if tokens.ndim == 1:
      tokens = tokens[None]
    i, t = 0, self.segment_length
    while i < tokens.shape[1]:
      if self.position == 0 and tokens.shape[1] - i >= t:
        self.segment[:] = tokens[:, i : i + t]
        self.logits, self.memory = self._advance(self._state, self.memory, self.segment.copy())
        i += t
      else:
        self._feed_one(tokens[:, i])
        i += 1

  def _feed_one(self, token: np.ndarray) -> None:
    self.segment[:, self.position] = token
    self.logits, self.memory = self._step(
      self._state,
      self.memory,
      self._table,
      jnp.asarray(token),
      jnp.asarray(self.position, jnp.int32),
    )
    self.position += 1
    if self.position == self.segment_length:
      # The segment is complete: push it into the memory (compressing what
      # falls out) with one whole-segment call. A copy:
      # on CPU, JAX may read a NumPy argument in place after the call has
      # returned (asynchronous dispatch), while the next tokens overwrite it.
      _, self.memory = self._advance(self._state, self.memory, self.segment.copy())
      self.position = 0

  def generate(
    self,
    prompt: Sequence[int] | np.ndarray,
    num_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int = 0,
  ) -> Iterator[np.ndarray]:
    """Feeds the prompt, then yields `num_tokens` new tokens [B] one at a time.

    The arguments are checked at the call (ValueError), not at the first token.
    """
    prompt = np.asarray(prompt, np.int32)
    if prompt.size == 0:
      raise ValueError("the prompt is empty: give at least one token")
    check_sampling_args(num_tokens, temperature, top_k, top_p)
    return self._generate(prompt, num_tokens, temperature, top_k, top_p, seed)

  def _generate(
    self,
    prompt: np.ndarray,
    num_tokens: int,
    temperature: float,
    top_k: int,
    top_p: float,
    seed: int,
  ) -> Iterator[np.ndarray]:
    self.feed(prompt)
    rng = jax.random.PRNGKey(seed)
    pick = jax.jit(choose, static_argnums=(2, 3, 4))
    for n in range(num_tokens):
      token = np.asarray(pick(self.logits, jax.random.fold_in(rng, n), temperature, top_k, top_p))
      yield token
      self._feed_one(token)


class TextStream:
  """Turns generated token ids into text pieces as they come.

  Bytes may split a UTF-8 character and subword pieces carry their spacing in
  context, so each piece is the difference between decoding a short tail of
  recent tokens with and without the new ones. Work per token is constant.
  """

  def __init__(self, tokenizer: Tokenizer, context: int = 16) -> None:
    self._tokenizer = tokenizer
    self._tail: list[int] = []  # recent tokens already shown
    self._pending: list[int] = []  # tokens of an incomplete character
    self._context = context

  def push(self, token: int) -> str:
    self._pending.append(int(token))
    piece = self._piece()
    if piece.endswith("\ufffd") and len(self._pending) < 4:
      return ""  # a UTF-8 character cut short: wait for the rest of it
    return self._shown(piece)

  def flush(self) -> str:
    """The text of tokens still held back (a character the generation cut
    short, shown as U+FFFD, as errors="replace" decodes it); call it once
    the last token is pushed, so that no generated token goes unshown."""
    return self._shown(self._piece()) if self._pending else ""

  def _piece(self) -> str:
    before = self._tokenizer.decode(self._tail) if self._tail else ""
    after = self._tokenizer.decode(self._tail + self._pending)
    return (
      after[len(before) :] if after.startswith(before) else self._tokenizer.decode(self._pending)
    )

  def _shown(self, piece: str) -> str:
    self._tail = (self._tail + self._pending)[-self._context :]
    self._pending = []
    return piece
