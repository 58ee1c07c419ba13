"""The shipped experiment configs, as the package `compressive.configs`.

The files are the repository's top-level configs/ folder: installed, they
are this package (pyproject.toml maps configs/ to compressive/configs); in a
checkout, this file points the package at that folder. The configs import
their bases from here (`from compressive.configs import default`), never as
a top-level `configs`, so that no folder on sys.path (a project's own
configs/, which `python -m` puts first) and no other installed package can
replace them. A config of one's own builds on a shipped one the same way.
"""

import os

_REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_CHECKOUT = os.path.join(_REPOSITORY, "configs")
if os.path.isfile(os.path.join(_CHECKOUT, "default.py")):
  __path__ = [_CHECKOUT]
