"""Parameters drawn as matrices (`layers.param(..., rows=r)`): the same numbers
as the N-D draw, and every random draw of a model's initialisation of rank 2
at most (XLA:CPU compiles a rank-3 or rank-4 draw many times more slowly)."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from compressive.model import compression
from compressive.model.layers import param
from compressive.training import step as train_step
from helpers import tiny_model_config


def drawn(init, shape, dtype, rows, seed=0):
  return param(init, nnx.Rngs(seed), shape, ("a",) * len(shape), dtype, rows=rows)[...]


def initializers(shape, rows):
  """(as a matrix, N-D with the matrix's in-axes) pairs of initializers."""
  fan_in, fan_out = tuple(range(rows)), tuple(range(rows, len(shape)))
  return [
    (nnx.initializers.lecun_normal(), nnx.initializers.lecun_normal(fan_in, fan_out)),
    (
      nnx.initializers.variance_scaling(2.0, "fan_avg", "uniform"),
      nnx.initializers.variance_scaling(2.0, "fan_avg", "uniform", fan_in, fan_out),
    ),
    (nnx.initializers.normal(0.02), nnx.initializers.normal(0.02)),
  ]


def assert_same(got, want):
  assert got.shape == want.shape and got.dtype == want.dtype
  np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))


# Rank 3 here: a rank-4 N-D draw alone compiles for seconds on XLA:CPU (the
# dilated convolution's rank-4 kernel is checked below, once).
@pytest.mark.parametrize("shape,rows", [((16, 2, 8), 1), ((2, 8, 16), 2)])
def test_a_matrix_draw_equals_the_n_d_draw(shape, rows):
  key = nnx.Rngs(0).params()  # the key param() draws with
  for matrix, n_d in initializers(shape, rows):
    assert_same(drawn(matrix, shape, jnp.float32, rows), n_d(key, shape, jnp.float32))


def test_a_traced_or_bfloat16_matrix_draw_equals_the_n_d_draw_too():
  shape, rows = (16, 2, 8), 1
  key = nnx.Rngs(0).params()
  matrix, n_d = initializers(shape, rows)[0]
  assert_same(drawn(matrix, shape, jnp.bfloat16, rows), n_d(key, shape, jnp.bfloat16))
  # Traced, against the traced N-D draw (XLA may fuse the scaling otherwise
  # than the eager multiply does: 1 ulp apart, whatever the shape).
  assert_same(
    jax.jit(lambda: drawn(matrix, shape, jnp.float32, rows))(),
    jax.jit(lambda: n_d(key, shape, jnp.float32))(),
  )


def test_the_dilated_convolution_kernel_is_the_n_d_draw():
  rate, d = 4, 8
  fn = compression.DilatedConv(rate, d, rngs=nnx.Rngs(2))
  want = nnx.initializers.normal(0.02)(nnx.Rngs(2).params(), fn.kernel.shape, jnp.float32)
  assert fn.kernel.ndim == 4
  assert_same(fn.kernel[...], want)


def test_the_conv_compression_kernel_is_the_identity_taps_plus_the_n_d_noise():
  rate, d = 3, 8
  fn = compression.Conv(rate, d, rngs=nnx.Rngs(4))
  noise = nnx.initializers.normal(fn.NOISE / (rate * np.sqrt(d)))(
    nnx.Rngs(4).params(), (rate, d, d), jnp.float32
  )
  assert_same(fn.kernel[...], jnp.eye(d, dtype=jnp.float32)[None] / rate + noise)


def test_rows_outside_the_shape_are_refused():
  for rows in (0, 3):
    with pytest.raises(ValueError, match=f"rows={rows} for shape"):
      drawn(nnx.initializers.normal(), (2, 3, 4), jnp.float32, rows)


def random_draw_shapes(cfg):
  """The shape of every random draw in the jitted initialisation of `cfg`."""
  shapes = []

  def walk(jaxpr):
    for eqn in jaxpr.eqns:
      if eqn.primitive.name == "random_bits":
        shapes.append(tuple(eqn.params["shape"]))
      for value in eqn.params.values():
        for sub in value if isinstance(value, (tuple, list)) else (value,):
          if hasattr(sub, "eqns"):
            walk(sub)
          elif hasattr(getattr(sub, "jaxpr", None), "eqns"):
            walk(sub.jaxpr)

  walk(jax.make_jaxpr(lambda: train_step.build_model(cfg, 0)[2])().jaxpr)
  return shapes


@pytest.mark.parametrize(
  "overrides",
  [
    dict(compression="conv"),
    dict(compression="dilated_conv", compression_rate=4, positions="rope"),
    dict(reconstruction_loss="autoencoding", scan_layers=True),
  ],
)
def test_every_random_draw_of_a_models_initialisation_is_a_matrix(overrides):
  shapes = random_draw_shapes(tiny_model_config(**overrides))
  assert len(shapes) >= 10  # the walk reached the draws
  assert all(len(s) <= 2 for s in shapes), sorted(set(shapes))
