"""Tokenizers: UTF-8 bytes (enwik8, the default books run) and SentencePiece.

Both map `str -> np.int32 [L]` and back. Neither adds BOS/EOS: a document is
a plain token stream whose first token is context only (see `documents.py`),
the same for every tokenizer, so bits per byte and word-level perplexity are
comparable across them.

Id 0 is padding in batches. For bytes it is also the NUL byte (which never
occurs in text); SentencePiece models trained here reserve id 0 as `<pad>` so
that a padded position never aliases a real piece.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Protocol, Sequence

import numpy as np

from compressive import files
from compressive.errors import DataError

if TYPE_CHECKING:
  from compressive.data.config import DataConfig

# The most of a SentencePiece model read (a 32k vocabulary's is under 1 MiB).
SPM_BYTES = 256 << 20


class Tokenizer(Protocol):
  """What the data pipeline and the sampler need from a tokenizer."""

  @property
  def vocab_size(self) -> int: ...

  def encode(self, text: str) -> np.ndarray: ...

  def decode(self, ids: Sequence[int] | np.ndarray) -> str: ...

  @property
  def identity(self) -> str:
    """Names exactly this vocabulary (for a SentencePiece model, a digest of
    its file): a run records it, and tools that load the run compare."""
    ...


class ByteTokenizer:
  """UTF-8 bytes as tokens: vocabulary 256, bits per token = bits per byte."""

  vocab_size = 256
  identity = "bytes"

  def encode(self, text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)

  def decode(self, ids: Sequence[int] | np.ndarray) -> str:
    # A model may emit a byte sequence that is not valid UTF-8 (e.g. a cut
    # multi-byte character); show it as U+FFFD rather than failing mid-sample.
    data = np.asarray(ids, dtype=np.int64)
    if data.size and (data.min() < 0 or data.max() > 255):
      raise DataError("byte tokenizer ids must lie in [0, 255]")
    return data.astype(np.uint8).tobytes().decode("utf-8", errors="replace")


class SentencePieceTokenizer:
  """A trained SentencePiece model (the paper uses 32k subwords on PG-19)."""

  def __init__(self, model_path: str):
    import sentencepiece as spm

    if not model_path:
      raise DataError(
        "data.tokenizer=sentencepiece needs data.spm_model, the path of a "
        ".model file; train one with train_tokenizer.py --config=..."
      )
    if not os.path.exists(model_path):
      raise FileNotFoundError(
        f"SentencePiece model {model_path!r} (data.spm_model) does not "
        "exist; train it with train_tokenizer.py --config=..."
      )
    if os.path.isdir(model_path):
      raise DataError(
        f"SentencePiece model {model_path!r} (data.spm_model) is a folder, not a .model file"
      )
    self.model_path = model_path
    try:
      model = files.read_bytes(model_path, SPM_BYTES, follow=True)
    except files.NotAFileError as e:  # a FIFO, a device, a file past the bound
      raise DataError(f"SentencePiece model {model_path!r} (data.spm_model) is {e.what}") from None
    try:
      self._sp = spm.SentencePieceProcessor(model_proto=model)
    except (RuntimeError, OSError, TypeError) as e:
      first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
      raise DataError(
        f"{model_path!r} (data.spm_model) is not a SentencePiece model ({first})"
      ) from None
    self._identity = "sentencepiece:sha256:" + hashlib.sha256(model).hexdigest()

  @property
  def identity(self) -> str:
    return self._identity

  @property
  def vocab_size(self) -> int:
    return int(self._sp.get_piece_size())

  def encode(self, text: str) -> np.ndarray:
    return np.asarray(self._sp.encode(text), dtype=np.int32)

  def decode(self, ids: Sequence[int] | np.ndarray) -> str:
    """The text of `ids`; DataError (one line) for an id that is not one of
    the model's pieces (SentencePiece's own error is an IndexError)."""
    ids = [int(i) for i in np.asarray(ids).reshape(-1)]
    size = self.vocab_size
    bad = next((i for i in ids if not 0 <= i < size), None)
    if bad is not None:
      raise DataError(
        f"token id {bad} is not a piece of {self.model_path!r} (data.spm_model: "
        f"{size} pieces, ids 0-{size - 1}); a model whose model.vocab_size is "
        "larger than its tokenizer's pieces emitted it"
      )
    return self._sp.decode(ids)


def get_tokenizer(data_config: "DataConfig") -> Tokenizer:
  """The tokenizer named by `data_config.tokenizer` ('bytes'|'sentencepiece')."""
  name = data_config.tokenizer
  if name == "bytes":
    return ByteTokenizer()
  if name == "sentencepiece":
    return SentencePieceTokenizer(data_config.spm_model)
  raise DataError(f"Unknown data.tokenizer {name!r}; expected 'bytes' or 'sentencepiece'")


def _chunks(texts: Iterable[str], max_chars: int) -> Iterator[str]:
  """Cuts documents into line-aligned pieces of at most ~max_chars.

  SentencePiece samples and scores "sentences"; a whole book as one sentence
  would be dropped for exceeding max_sentence_length. Pieces keep their
  newlines, so '\\n' is learned as a symbol of its own.
  """
  if max_chars < 1:  # a piece of no characters would never advance
    raise ValueError(f"max_chars={max_chars} must be >= 1")
  for text in texts:
    start = 0
    while start < len(text):
      end = min(len(text), start + max_chars)
      if end < len(text):
        cut = text.rfind("\n", start, end)
        if cut > start:
          end = cut + 1
      piece = text[start:end]
      if piece.strip():
        yield piece
      start = end


# The trainer's settings that make the model lossless and plain (see
# train_sentencepiece): identity normalisation, whitespace kept, '\n' a
# symbol of its own; <pad>=0, <unk>=1, no BOS/EOS; vocab_size an upper bound.
_TRAINER_OPTIONS: dict[str, Any] = dict(
  normalization_rule_name="identity",
  remove_extra_whitespaces=False,
  user_defined_symbols=["\n"],
  pad_id=0,
  unk_id=1,
  bos_id=-1,
  eos_id=-1,
  hard_vocab_limit=False,
  shuffle_input_sentence=True,
  minloglevel=2,
)


def train_sentencepiece(
  texts: Iterable[str],
  vocab_size: int,
  model_path: str,
  *,
  model_type: str = "unigram",
  character_coverage: float = 0.9999,
  byte_fallback: bool = True,
  max_sentence_chars: int = 4096,
  input_sentence_size: int = 10_000_000,
  num_threads: int = 1,
  seed: int = 0,
) -> SentencePieceTokenizer:
  """Trains a lossless SentencePiece model on `texts`; writes `model_path`.

  Choices, and why:
  - identity normalisation, no whitespace squashing, byte fallback and '\\n'
    as a user symbol: decode(encode(text)) == text for any text, so bits per
    byte and word counts refer to exactly the original documents;
  - id 0 = <pad>, 1 = <unk>, no BOS/EOS (documents are plain streams);
  - hard_vocab_limit off: `vocab_size` is an upper bound, so tiny corpora in
    tests train; read the real size from `.vocab_size`. With byte fallback
    the vocabulary needs at least ~260 + number of characters entries.

  Args:
    texts: documents (any iterable, consumed once).
    vocab_size: the largest vocabulary to learn.
    model_path: where to write the .model file (folders are created).
    model_type: 'unigram' or 'bpe' (SentencePiece's names).
    character_coverage: share of characters covered by single pieces.
    byte_fallback: spell rare characters as UTF-8 byte pieces.
    max_sentence_chars: documents are cut at line ends into pieces of about
      this many characters, the units SentencePiece samples.
    input_sentence_size: at most this many pieces are sampled for training.
    num_threads: trainer threads.
    seed: seeds SentencePiece's sampling of pieces.

  Returns:
    The trained tokenizer, loaded from `model_path`.

  Raises:
    DataError: SentencePiece cannot train on these texts (a vocabulary too
      small for their characters, no text); what `texts` itself raises is
      raised as it is.
  """
  import sentencepiece as spm

  buffer = io.BytesIO()
  failures = []  # what the texts raised: SentencePiece would wrap it

  def sentences() -> Iterator[str]:
    try:
      yield from _chunks(texts, max_sentence_chars)
    except Exception as e:
      failures.append(e)
      raise

  spm.set_random_generator_seed(seed)
  try:
    spm.SentencePieceTrainer.train(
      sentence_iterator=sentences(),
      model_writer=buffer,
      vocab_size=vocab_size,
      model_type=model_type,
      character_coverage=character_coverage,
      byte_fallback=byte_fallback,
      # UTF-8 may take 4 bytes a character; leave room for the whole piece.
      max_sentence_length=4 * max_sentence_chars + 16,
      input_sentence_size=input_sentence_size,
      num_threads=num_threads,
      **_TRAINER_OPTIONS,
    )
  except RuntimeError as e:
    if failures:
      raise failures[0] from e  # e.g. a DataError naming a file of the corpus
    error = _training_error(str(e), vocab_size)
    if error is None:
      raise
    raise error from None
  _write_model(buffer.getvalue(), model_path)
  return SentencePieceTokenizer(model_path)


def _write_model(model: bytes, model_path: str) -> None:
  """Writes `model` to model_path (folders are created) whole or not at all
  (files.write_bytes: a full disk names the file and leaves nothing half
  written)."""
  os.makedirs(os.path.dirname(os.path.abspath(model_path)), exist_ok=True)
  files.write_bytes(model_path, model)


def _training_error(message: str, vocab_size: int) -> DataError | None:
  """A SentencePiece training failure that is the input's, as one line."""
  text = " ".join(message.split())
  needed = re.search(r"smaller than required_chars\. (\d+) vs (\d+)", text)
  if needed:
    return DataError(
      f"vocab_size={vocab_size} (data.spm_vocab_size) is too small for this corpus: "
      f"its characters and the byte pieces need at least {needed.group(2)}; raise it, or "
      "lower data.spm_character_coverage"
    )
  if "sentences_.empty()" in text:
    return DataError("SentencePiece found no text to train on: the train split is empty or blank")
  return None  # not known to be the input's fault: a bug keeps its traceback
