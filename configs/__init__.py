"""The shipped experiment configs: `--config=NAME` is NAME.py of this folder.
Installed, this folder is the package `compressive.configs` (see
compressive/configs/__init__.py); the configs import each other from there.
"""
