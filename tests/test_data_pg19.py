"""PG-19 through TFDS: the real builder on a generated tiny raw layout, and
`tfds.testing.mock_data` for the data-source path without any files."""

import pathlib

import numpy as np
import pytest

from compressive import data

tfds = pytest.importorskip('tensorflow_datasets')

BOOKS = {  # split -> {book_id: text}
    'train': {101: 'Call me Ishmael.\nSome years ago', 102: 'It was the best',
              103: 'In a hole in the ground', 104: 'Happy families'},
    'validation': {201: '  The validation book,\nwith  two lines.\n\n',
                   202: 'Another one'},
    'test': {301: 'The test book', 302: 'Último libro ★'},
}


@pytest.fixture(scope='module')
def prepared(tmp_path_factory):
  """A tiny PG-19 laid out like gs://deepmind-gutenberg, prepared once."""
  root = tmp_path_factory.mktemp('pg19')
  raw = root / 'raw'
  rows = ['_id,short_book_title,publication_date,url']  # A header is skipped.
  for split, books in BOOKS.items():
    (raw / split).mkdir(parents=True)
    for book_id, text in books.items():
      (raw / split / f'{book_id}.txt').write_text(text, encoding='utf-8')
      rows.append(f'{book_id},"Title {book_id}, a novel",1900,'
                  f'http://www.gutenberg.org/ebooks/{book_id}')
  (raw / 'metadata.csv').write_text('\n'.join(rows) + '\n')
  config = data.default_data_config()
  config.source = 'pg19'
  config.pg19.data_dir = str(root / 'tfds')
  config.pg19.raw_dir = str(raw)
  return config


def test_real_builder_prepares_local_raw_files(prepared):
  tok = data.ByteTokenizer()
  for split, books in BOOKS.items():
    docs = data.get_documents(prepared, split, tok)
    assert len(docs) == len(books)
    got = {}
    for i in range(len(docs)):
      book_id, title = docs.name(i).split(' ', 1)
      assert title == f'Title {book_id}, a novel'  # Quoted comma kept.
      got[int(book_id)] = docs.text(i)
      original = books[int(book_id)].strip()  # The builder strips texts.
      assert docs.text(i) == original
      assert docs.num_words(i) == len(original.split())
      assert docs.num_bytes(i) == len(original.encode('utf-8'))
      np.testing.assert_array_equal(docs.tokens(i), tok.encode(original))
    assert set(got) == set(books)
  # Prepared in array_record under data_dir; a second call reuses it and
  # gives the same (fixed) record order.
  variant = pathlib.Path(prepared.pg19.data_dir) / 'pg19' / '0.1.1'
  assert list(variant.glob('pg19-train.array_record*'))
  a = data.get_documents(prepared, 'train', tok)
  b = data.get_documents(prepared, 'train', tok)
  assert [a.name(i) for i in range(len(a))] == [b.name(i)
                                                for i in range(len(b))]


def test_evaluation_pass_over_pg19(prepared):
  docs = data.get_documents(prepared, 'validation', data.ByteTokenizer())
  it = data.SegmentIterator(docs, batch_size=2, segment_length=8,
                            repeat=False)
  batches = list(it)
  predicted = sum(int(b['mask'].sum()) for b in batches)
  assert predicted == sum(docs.num_tokens(i) - 1 for i in range(len(docs)))


def test_mock_data_source():
  config = data.default_data_config()
  config.source = 'pg19'
  config.pg19.data_dir = '/nonexistent/never/read'
  with tfds.testing.mock_data(num_examples=5):
    docs = data.get_documents(config, 'test', data.ByteTokenizer())
    assert len(docs) == 5
    for i in range(5):
      assert docs.num_bytes(i) == len(docs.text(i).encode('utf-8'))
    it = data.SegmentIterator(docs, batch_size=5, segment_length=4, seed=0)
    batch = next(it)
    assert batch['start_of_sequence'].all()


def test_pg19_config_errors(tmp_path):
  config = data.default_data_config()
  config.source = 'pg19'
  with pytest.raises(ValueError, match='data.pg19.data_dir'):
    data.get_documents(config, 'train', data.ByteTokenizer())
  config.pg19.data_dir = str(tmp_path / 'tfds')
  config.pg19.raw_dir = str(tmp_path / 'absent')
  with pytest.raises(FileNotFoundError, match='absent'):
    data.get_documents(config, 'train', data.ByteTokenizer())
  (tmp_path / 'raw').mkdir()
  config.pg19.raw_dir = str(tmp_path / 'raw')
  with pytest.raises(FileNotFoundError, match='metadata.csv'):
    data.get_documents(config, 'train', data.ByteTokenizer())
