"""Trains the SentencePiece tokenizer of an experiment on its train split.

    python train_tokenizer.py --config=configs/pg19.py

Reads at most config.data.spm_train_max_bytes of the training split of
config.data.source (documents in seeded random order) and writes the model
to config.data.spm_model, with config.data.spm_vocab_size pieces at most
(the paper: 32k subwords for PG-19).
"""

import os

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from compressive import data

_CONFIG = config_flags.DEFINE_config_file(
    'config', None, 'Experiment config file.', lock_config=True)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  data_config = _CONFIG.value.data
  if not data_config.spm_model:
    raise app.UsageError('config.data.spm_model (the output path) is empty')
  texts = data.iter_texts(data_config, 'train',
                          max_bytes=data_config.spm_train_max_bytes,
                          seed=data_config.spm_train_seed)
  tokenizer = data.train_sentencepiece(
      texts,
      vocab_size=data_config.spm_vocab_size,
      model_path=data_config.spm_model,
      model_type=data_config.spm_model_type,
      character_coverage=data_config.spm_character_coverage,
      num_threads=os.cpu_count() or 1,
      seed=data_config.spm_train_seed)
  logging.info('Wrote %s (%d pieces).', data_config.spm_model,
               tokenizer.vocab_size)


if __name__ == '__main__':
  flags.mark_flag_as_required('config')
  app.run(main)
