"""The hardware layer: meshes and shardings, FLOP counts, and the accelerator
targets (device kinds, memory and peak FLOP/s) that `aot.py` compiles for.
A new mesh rule (a logical axis -> mesh axes) goes in `sharding.py`.
"""
