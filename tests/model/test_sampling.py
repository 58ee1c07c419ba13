"""Streaming generation: cached decoding equals uncached decoding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import compressive
from compressive.model.sampling import Sampler, choose
from helpers import greedy_without_cache, jitted_forward, make_model, tiny_model_config


@pytest.mark.parametrize(
  "compression,keys_values", [("conv", "shared"), ("most_used", "shared"), ("conv", "own")]
)
def test_greedy_cached_decoding_equals_uncached(compression, keys_values):
  cfg = tiny_model_config(
    vocab_size=32, compression=compression, num_layers=2, compressed_keys_values=keys_values
  )
  model = make_model(cfg, seed=3)
  prompt = [int(x) for x in jax.random.randint(jax.random.PRNGKey(0), (6,), 0, 32)]
  n = 30  # crosses several segment boundaries and compressions (T = 4)
  want = greedy_without_cache(cfg, model, prompt, n)
  sampler = Sampler(model, batch_size=1)
  got = [int(tok[0]) for tok in sampler.generate(prompt, n, temperature=0.0)]
  assert got == want
  assert bool(sampler.memory.cmem_mask.any())  # the memory was compressed on the way


def test_cached_logits_match_a_full_segment():
  cfg = tiny_model_config()
  model = make_model(cfg)
  state, forward = jitted_forward(model)
  tokens = jax.random.randint(jax.random.PRNGKey(5), (2, 3 * cfg.segment_length), 0, cfg.vocab_size)
  want, _ = [], None
  memory = compressive.init_memory(cfg, 2)
  for s in range(3):
    logits, memory, _ = forward(state, tokens[:, s * 4 : (s + 1) * 4], memory, None)
    want.append(logits)
  want = np.asarray(jnp.concatenate(want, 1))
  sampler = Sampler(model, batch_size=2)
  got = []
  for i in range(tokens.shape[1]):
    sampler.feed(np.asarray(tokens[:, i : i + 1]))
    got.append(np.asarray(sampler.logits))
  np.testing.assert_allclose(np.stack(got, 1), want, rtol=1e-4, atol=1e-4)


def test_top_k_and_top_p_restrict_the_choice():
  logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]]))
  keys = [jax.random.PRNGKey(i) for i in range(200)]
  top1 = {int(choose(logits, k, 1.0, 1, 1.0)[0]) for k in keys}
  assert top1 == {0}
  top2 = {int(choose(logits, k, 1.0, 2, 1.0)[0]) for k in keys}
  assert top2 == {0, 1}
  nucleus = {int(choose(logits, k, 1.0, 0, 0.7)[0]) for k in keys}
  assert nucleus == {0, 1}  # 0.5 < 0.7 <= 0.8
  assert int(choose(logits, keys[0], 0.0, 0, 1.0)[0]) == 0


def test_text_stream_reassembles_utf8_and_subwords():
  from compressive.data import ByteTokenizer
  from compressive.model.sampling import TextStream

  text = "naïve café — 東京 ok"
  tok = ByteTokenizer()
  stream = TextStream(tok, context=4)
  assert "".join(stream.push(t) for t in tok.encode(text)) == text


def test_text_stream_shows_a_character_cut_short_at_the_end():
  # sample.py stops after --num_tokens whatever the last token completes:
  # the bytes of an unfinished character are flushed as U+FFFD, not lost.
  from compressive.data import ByteTokenizer
  from compressive.model.sampling import TextStream

  tok = ByteTokenizer()
  stream = TextStream(tok)
  ids = tok.encode("ab東")[:-1]  # the last character's third byte never comes
  shown = "".join(stream.push(t) for t in ids)
  assert shown == "ab"
  assert shown + stream.flush() == "ab\ufffd"
  assert stream.flush() == ""  # once
