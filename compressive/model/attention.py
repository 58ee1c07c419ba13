"""Relative multi-head attention over [compressed memory; memory; segment].

Notation: B rows, Tq queries, S = C + M memory slots, K keys, H heads,
D head width, d model width.

Positions are indices along the keys: key j sits at j, and the Tq queries at
q_last - Tq + 1 .. q_last, so dist(i, j) = (q_last - Tq + 1 + i) - j. A whole
segment has Tq = T queries ending at q_last = K - 1; one decoded token has
Tq = 1 and sits at S + its index in the segment, with the segment's later
slots (empty) masked. Valid slots are always the newest of each bank, so the
index distance is the true token distance inside the memory. Two ways to turn
it into scores (`model.positions`):

- "relative" (default): Transformer-XL relative positions (Dai et al. 2019,
  §3.3; docs/PAPER.md §Model), with R sinusoidal and learned u, v, W_r:

      (q_i + u) . k_j  +  (q_i + v) . (W_r R_{dist(i, j)})

- "rope": rotary embeddings (Su et al. 2021): q_i is rotated by the angles of
  its position and k_j by those of j, so rot(q_i) . rot(k_j) depends on
  dist(i, j) only. No extra parameters, and the score is a plain dot product,
  so the output can come from `jax.nn.dot_product_attention` (a fused kernel)
  when the attention weights themselves are not needed. Keys are cached
  unrotated (a slot's index shifts every segment) and rotated at use.

Query i sees every valid key at or before its own position.

The attention returns, besides its output, `received` [B, K]: the weight each
key received, averaged over heads and queries (float32, before attention
dropout, not differentiated). It feeds the most-used compression's usage and
the attention-mass diagnostics.

Memory: a whole segment's [B, H, T, K] scores and weights are the largest
tensors of the step (and the backward pass keeps the weights). With
`chunk_size` > 0 the queries attend in chunks of `chunk_size`, one chunk at a
time (`lax.map`), each under `jax.checkpoint`: only one chunk's
[B, H, chunk, K] scores exist at once, forward or backward, at the price of
recomputing them in the backward pass. It is not an approximation: every
query's scores are the whole segment's, computed in pieces (sums over heads,
queries or chunks may round differently). Attention dropout draws per chunk.
With `chunk_size` 0 (or at least the queries) the segment is a single chunk
of the same kernel, run as it is: no loop, nothing recomputed.
"""

from __future__ import annotations

from typing import Callable, Literal, Optional

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from compressive.model.layers import LayerNorm, dense, masked_softmax, param

POSITIONS = ("relative", "rope")  # model.positions
# model.attention_implementation: what computes rope's fused attention
# (`jax.nn.dot_product_attention`'s `implementation`): JAX's choice, XLA's
# own, or cuDNN's fused kernel (GPU only).
IMPLEMENTATIONS: dict[str, Optional[Literal["xla", "cudnn"]]] = {
  "auto": None,
  "xla": "xla",
  "cudnn": "cudnn",
}


def sinusoids(
  distances: np.ndarray, d: int, dtype: jax.typing.DTypeLike = jnp.float32
) -> jax.Array:
  """R for the given distances: [N, d]; `sinusoids(np.arange(K - 1, -1, -1), d)`
  is R for a segment's K keys. Computed here, not traced: the table depends
  on static sizes only, and as a constant it costs the step nothing."""
  inv_freq = 1.0 / (10000 ** (np.arange(0, d, 2, dtype=np.float32) / d))
  angles = np.asarray(distances, np.float32)[:, None] * inv_freq[None, :]
  return jnp.asarray(np.concatenate([np.sin(angles), np.cos(angles)], -1), dtype)


def rel_shift(x: jax.Array) -> jax.Array:
  """Turns position scores indexed by R's row into scores indexed by key.

  x[..., i, p] is the score of query i against R row p, whose distance is
  q_last - p; the result [..., i, j] is the score for dist(i, j) =
  q_last - T + 1 + i - j, for every j <= q_last - T + 1 + i (entries past that
  are future keys, masked by the caller).
  """
  *lead, t, k = x.shape
  x = jnp.pad(x, [(0, 0)] * len(lead) + [(0, 0), (1, 0)])  # [..., T, K + 1]
  x = x.reshape(*lead, k + 1, t)[..., 1:, :]  # [..., K, T]
  return x.reshape(*lead, t, k)


def rotate(x: jax.Array, index: jax.Array) -> jax.Array:
  """Rotary position embedding of x [B, N, H, D] at positions index [N].

  Channel a and a + D/2 form a pair turned by index * theta_a, with
  theta_a = 10000^(-2a / D); then rotate(q, i) . rotate(k, j) depends on i - j
  only. Computed in float32 (indices reach thousands in evaluation).
  """
  half = x.shape[-1] // 2
  inv_freq = 1.0 / (10000 ** (jnp.arange(half, dtype=jnp.float32) * 2 / (2 * half)))
  angles = jnp.asarray(index).astype(jnp.float32)[:, None, None] * inv_freq  # [N, 1, D/2]
  cos, sin = jnp.cos(angles), jnp.sin(angles)
  x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).astype(x.dtype)


def heads(a: jax.Array) -> jax.Array:
  """[B, N, H, D] <-> [B, H, N, D]. Score and value products run head-major:
  with the head axis next to the batch axis they are plain batched matmuls,
  and the [B, H, N, K] scores never need a transpose."""
  return jnp.swapaxes(a, 1, 2)


def causal_mask(
  key_valid: jax.Array,
  t: int,
  q_last: int | jax.Array | None = None,
  first: int | jax.Array = 0,
  count: Optional[int] = None,
) -> jax.Array:
  """[B, K] key validity -> [B, 1, T, K]: valid and not after the query
  (queries at q_last - T + 1 .. q_last; q_last defaults to K - 1).

  `first` and `count` select the rows of queries first .. first + count - 1
  of the T (a query chunk; `first` may be traced): [B, 1, count, K].
  """
  k = key_valid.shape[-1]
  q_last = k - 1 if q_last is None else q_last
  count = t if count is None else count
  visible = jnp.arange(k)[None, :] <= (q_last - t + 1 + first + jnp.arange(count))[:, None]
  return (visible[None] & key_valid[:, None, :])[:, None]


def _over_chunks(
  chunk: Callable[..., tuple[jax.Array, Optional[jax.Array]]],
  queries: tuple[jax.Array, ...],
  shape: tuple[int, ...],
  n: int,
  dropout_rng: Optional[jax.Array],
  per_query: bool,
) -> tuple[jax.Array, Optional[jax.Array]]:
  """`RelativeAttention.__call__`'s chunks of n queries run in turn
  (`lax.map`), each under `jax.checkpoint`: chunk(c, chunk c's queries,
  its dropout key) -> (its output [B, n, H, D], its weights or None).
  `queries` [B, Tq, H, D] each, `shape` (B, Tq, H, D). Returns the output
  [B, Tq, H, D] and the weights' sum over the chunks [B, K] (with
  `per_query` every query's [B, H, Tq, K]), or None."""
  b, t, h, hd = shape
  # [B, Tq, H, D] -> [Tq/n, B, n, H, D]: lax.map's leading chunk axis.
  split = lambda a: jnp.swapaxes(a.reshape(b, t // n, n, h, hd), 0, 1)
  fold = lambda c: None if dropout_rng is None else jax.random.fold_in(dropout_rng, c)
  step = lambda xs: chunk(xs[0], xs[1:], fold(xs[0]))
  # prevent_cse=False: the loop already keeps XLA from merging the
  # recomputation into the forward pass (jax.checkpoint's documentation);
  # the guard would only cost speed.
  out, received = jax.lax.map(
    jax.checkpoint(step, prevent_cse=False), (jnp.arange(t // n),) + tuple(map(split, queries))
  )
  out = jnp.swapaxes(out, 0, 1).reshape(b, t, h, hd)  # [Tq/n, B, n, H, D] -> [B, Tq, H, D]
  if received is not None and per_query:  # [Tq/n, B, H, n, K] -> [B, H, Tq, K]
    received = jnp.moveaxis(received, 0, 2).reshape(b, h, t, received.shape[-1])
  elif received is not None:
    received = received.sum(0)
  return out, received


class RelativeAttention(nnx.Module):
  """Multi-head attention of one layer, relative or rotary; with
  `normalize_inputs` (pre-norm) its projections read LN(x).

  `chunk_size` > 0: queries attend in rematerialised chunks of that many
  (module docstring); 0 attends with the whole segment at once.
  """

  def __init__(
    self,
    d_model: int,
    num_heads: int,
    *,
    dropout_rate: float,
    rngs: nnx.Rngs,
    positions: str = "relative",
    dtype: jax.typing.DTypeLike = jnp.float32,
    param_dtype: jax.typing.DTypeLike = jnp.float32,
    chunk_size: int = 0,
    implementation: str = "auto",
    normalize_inputs: bool = True,
    own_compressed_keys_values: bool = False,
  ) -> None:
    if positions not in POSITIONS:
      raise ValueError(f"positions={positions!r}; choose one of {', '.join(POSITIONS)}")
    h, hd = num_heads, d_model // num_heads
    self.positions = positions
    self.implementation = IMPLEMENTATIONS[implementation]
    self.num_heads, self.head_dim = h, hd
    # Drawn as d x (h*hd) and h*hd x d matrices: lecun_normal with fan-in d
    # and h*hd, the same numbers as drawing (d, h, hd) and (h, hd, d) with
    # those in-axes (see `param`).
    init = nnx.initializers.lecun_normal()
    proj = lambda: param(
      init, rngs, (d_model, h, hd), ("embed", "heads", "head_dim"), param_dtype, rows=1
    )
    # Pre-norm: the projections read LN(x). Post-norm: x itself, already the
    # previous layer's LN output (the caller normalises after the residual).
    self.norm = LayerNorm(d_model, param_dtype=param_dtype) if normalize_inputs else None
    self.wq, self.wk, self.wv = proj(), proj(), proj()
    if positions == "relative":  # rope has no position parameters
      self.wr = proj()  # drawn before wo, as relative models always initialised
    self.wo = param(
      init, rngs, (h, hd, d_model), ("heads", "head_dim", "embed"), param_dtype, rows=2
    )
    if positions == "relative":
      self.u = param(nnx.initializers.zeros, None, (h, hd), ("heads", "head_dim"), param_dtype)
      self.v = param(nnx.initializers.zeros, None, (h, hd), ("heads", "head_dim"), param_dtype)
    # model.compressed_keys_values="own": the compressed slots' W_k^c, W_v^c,
    # drawn last, so that a model without them initialises as it always has.
    self.own_compressed = own_compressed_keys_values
    if own_compressed_keys_values:
      self.wkc, self.wvc = proj(), proj()
    self.dropout = nnx.Dropout(dropout_rate, deterministic=False)
    self.dtype = dtype
    self.scale = hd**-0.5
    self.chunk_size = chunk_size

  def _w(self, name: str, frozen: bool = False) -> jax.Array:
    w = getattr(self, name)[...].astype(self.dtype)
    return jax.lax.stop_gradient(w) if frozen else w

  def query(self, x: jax.Array) -> jax.Array:
    """[B, T, d] layer inputs -> queries [B, T, H, D]."""
    return dense(self._normalize(x), self._w("wq"))

  def _normalize(self, x: jax.Array, frozen: bool = False) -> jax.Array:
    return x if self.norm is None else self.norm(x, frozen=frozen)

  def keys_values(self, slots: jax.Array, *, frozen: bool = False) -> tuple[jax.Array, jax.Array]:
    """[B, N, d] layer inputs (memory or segment) -> keys, values [B, N, H, D].

    Normalisation is per slot, so a memory slot's keys can be computed once
    and cached while the weights do not change (evaluation, generation).
    `frozen` reads the weights behind a stop-gradient: a gradient reaches the
    slots, never the weights (the reconstruction loss).
    """
    n = self._normalize(slots, frozen)
    return dense(n, self._w("wk", frozen)), dense(n, self._w("wv", frozen))

  def compressed_keys_values(
    self, slots: jax.Array, *, frozen: bool = False
  ) -> tuple[jax.Array, jax.Array]:
    """[B, C, d] compressed slots -> keys, values [B, C, H, D]: through W_k^c
    and W_v^c with model.compressed_keys_values="own", else `keys_values`."""
    if not self.own_compressed:
      return self.keys_values(slots, frozen=frozen)
    n = self._normalize(slots, frozen)
    return dense(n, self._w("wkc", frozen)), dense(n, self._w("wvc", frozen))

  def past_keys_values(self, cmem: jax.Array, mem: jax.Array) -> tuple[jax.Array, jax.Array]:
    """[compressed memory; memory] slots -> their keys and values
    [B, C + M, H, D], each part through its own projections."""
    if not self.own_compressed:  # one projection of the slots together, as always
      return self.keys_values(jnp.concatenate([cmem, mem], 1))
    (kc, vc), (km, vm) = self.compressed_keys_values(cmem), self.keys_values(mem)
    return jnp.concatenate([kc, km], 1), jnp.concatenate([vc, vm], 1)

  def position_keys(self, table: jax.Array) -> Optional[jax.Array]:
    """Sinusoids [N, d] -> W_r R [N, H, D]; None in rope mode (no W_r)."""
    if self.positions == "rope":
      return None
    return dense(table.astype(self.dtype), self._w("wr"))

  def __call__(
    self,
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    valid: jax.Array,
    q_last: int | jax.Array,
    r: Optional[jax.Array],
    *,
    dropout_rng: Optional[jax.Array] = None,
    need_weights: bool = True,
    per_query: bool = False,
  ) -> tuple[jax.Array, Optional[jax.Array]]:
    """Attends from queries q [B, Tq, H, D] over keys and values [B, K, H, D].

    Args:
      valid: [B, K] bool, the keys that hold something.
      q_last: the last query's key index (an int, or traced when decoding).
      r: [K, H, D] W_r R, row j for distance q_last - j (relative mode).
      dropout_rng: key for attention dropout; None when deterministic.
      need_weights: False lets rope mode compute the output with
        `jax.nn.dot_product_attention`, which never materialises the weights
        (unless attention dropout is on: the fused call has no dropout).
      per_query: return every head's and query's weights [B, H, Tq, K]
        instead of their mean (the analyses read where each query looks).

    Returns:
      The output [B, Tq, d] and `received` [B, K] float32: the weight each
      key received (before attention dropout), mean over heads and queries;
      a stop-gradient statistic. None when the fused call made the output.
      With `per_query`, the weights themselves [B, H, Tq, K] in its place.

    One kernel: the queries attend in chunks of n (`chunk_size`, or all Tq
    at once: one chunk), each scored by the positions' scorer (`_rope`,
    `_relative`) and attended by `_attend`. Everything linear in the queries
    (biases, rotation, the scale) is applied to all Tq at once. A single
    chunk runs as it is; several run in turn (`lax.map`, so the compiled code
    is one chunk's whatever their number), each under `jax.checkpoint`: the
    backward pass recomputes a chunk's scores instead of keeping every
    chunk's. Chunks give the same output and `received` up to float
    rounding; attention dropout then draws per chunk, so its mask differs
    from the whole segment's (at the same rate).
    """
    b, t, h, hd = q.shape
    n = self.chunk_size if self.chunk_size and t > self.chunk_size else t
    assert t % n == 0, f"{t} queries do not split into chunks of {n}"
    if self.positions == "rope":
      queries, k, score = self._rope(q, k, q_last)
    else:
      assert r is not None, "relative positions score with r (position_keys)"
      queries, score = self._relative(q, k, r, n)
    fused = self.positions == "rope" and not (need_weights or per_query) and dropout_rng is None
    v_heads = None if fused else heads(v)

    def chunk(
      c: int | jax.Array, qs: tuple[jax.Array, ...], rng: Optional[jax.Array]
    ) -> tuple[jax.Array, Optional[jax.Array]]:
      mask = causal_mask(valid, t, q_last, c * n, n)  # [B, 1, n, K]
      if fused:
        return jax.nn.dot_product_attention(
          qs[0], k, v, mask=mask, scale=self.scale, implementation=self.implementation
        ), None
      assert v_heads is not None  # made whenever the output is not fused
      return self._attend(score(c, *qs), mask, v_heads, rng, per_query)

    if n == t:  # one chunk: no loop, nothing recomputed
      out, received = chunk(0, queries, dropout_rng)
    else:
      out, received = _over_chunks(chunk, queries, q.shape, n, dropout_rng, per_query)
    if received is not None and not per_query:  # sums over chunks, heads and queries -> their mean
      received = received / (h * t)
    return dense(out, self._w("wo"), 2), received

  def _attend(
    self,
    logits: jax.Array,
    mask: jax.Array,
    v_heads: jax.Array,
    rng: Optional[jax.Array],
    per_query: bool = False,
  ) -> tuple[jax.Array, jax.Array]:
    """A chunk's float32 scores [B, H, n, K] -> its output [B, n, H, D] and
    the weights' sum over heads and queries [B, K] (stop-gradient), or with
    `per_query` the weights [B, H, n, K] themselves."""
    probs = masked_softmax(logits, mask)  # [B, H, n, K]
    dropped = probs if rng is None else self.dropout(probs, rngs=rng)
    out = jnp.einsum("bhtk,bhke->bhte", dropped.astype(self.dtype), v_heads)
    weights = jax.lax.stop_gradient(probs.astype(jnp.float32))
    return heads(out), weights if per_query else weights.sum(axis=(1, 2))

  def _rope(
    self, q: jax.Array, k: jax.Array, q_last: int | jax.Array
  ) -> tuple[tuple[jax.Array, ...], jax.Array, Callable[..., jax.Array]]:
    """Rotary scorer: (queries (q rotated,), keys rotated, score(c, qc)),
    score giving chunk c's float32 scores [B, H, n, K]: plain dot products
    of rotated queries and keys."""
    t = q.shape[1]
    q_rot = rotate(q, q_last - t + 1 + jnp.arange(t))
    k_rot = rotate(k, jnp.arange(k.shape[1]))
    k_heads = heads(k_rot)

    def score(c: int | jax.Array, qc: jax.Array) -> jax.Array:
      del c  # rotation already placed every query
      return jnp.einsum("bhte,bhke->bhtk", heads(qc) * self.scale, k_heads).astype(jnp.float32)

    return (q_rot,), k_rot, score

  def _relative(
    self, q: jax.Array, k: jax.Array, r: jax.Array, n: int
  ) -> tuple[tuple[jax.Array, ...], Callable[..., jax.Array]]:
    """Transformer-XL scorer for chunks of n of the Tq queries: (queries
    (q + u, q + v, both scaled), score(c, qu, qv)), score giving chunk c's
    float32 scores [B, H, n, K].

    The content scores are qu . k. The position scores of query i against
    key j read R row p = Tq - 1 - i + j (row p is distance q_last - p; query
    i sits at q_last - Tq + 1 + i). For chunk c's queries i = c*n + a,
    a < n, scoring against the K rows from s = Tq - (c + 1)*n gives x[a, p']
    for row s + p', and `rel_shift` of the [n, K] scores puts row
    p' = n - 1 - a + j at [a, j] for every visible key: j visible means
    p <= q_last <= K - 1, so p' <= K - 1 - s stays inside the window. Rows
    past K - 1 score only future keys, so r is padded with Tq - n zero rows
    for the windows of the first chunks. A single chunk (n = Tq) reads r
    itself, as the whole segment always did.
    """
    b, t, h, hd = q.shape
    kk = k.shape[1]
    k_heads = heads(k)
    # [H, K (+ Tq - n), D], head-major: position products of all rows at once
    # need no transpose, and only whole [n, K] blocks move to [B, H, n, K].
    r = jnp.swapaxes(r if n == t else jnp.pad(r, ((0, t - n), (0, 0), (0, 0))), 0, 1)

    def score(c: int | jax.Array, qu: jax.Array, qv: jax.Array) -> jax.Array:
      content = jnp.einsum("bhte,bhke->bhtk", heads(qu), k_heads)
      window = r if n == t else jax.lax.dynamic_slice_in_dim(r, t - (c + 1) * n, kk, 1)
      qv = jnp.transpose(qv, (2, 0, 1, 3)).reshape(h, b * n, hd)
      position = jax.lax.dot_general(qv, window, (((2,), (2,)), ((0,), (0,))))  # [H, B*n, K]
      position = rel_shift(position.reshape(h, b, n, kk)).swapaxes(0, 1)
      return (content + position).astype(jnp.float32)

    # The 1/sqrt(D) scale goes on the [B, Tq, H, D] queries, not on the K
    # times larger scores (nor, in the backward pass, on their gradient).
    return ((q + self._w("u")) * self.scale, (q + self._w("v")) * self.scale), score

  def content_attention(
    self, q: jax.Array, k: jax.Array, v: jax.Array, valid: jax.Array
  ) -> jax.Array:
    """Content-only attention (no positions, no causal mask) of queries
    q [B, T, H, D] over keys and values [B, N, H, D] with validity [B, N]:
    [B, T, H, D]. Used only by the attention-reconstruction loss, whose
    caller makes the queries and the weights stop-gradient."""
    logits = jnp.einsum("bthe,bnhe->bhtn", q * self.scale, k).astype(jnp.float32)
    probs = masked_softmax(logits, valid[:, None, None, :]).astype(self.dtype)
    return jnp.einsum("bhtn,bnhe->bthe", probs, v)
