"""The training layer: the jitted train step, the loop that drives it, and
what keeps a run whole and usable (checkpoints and their restore policy,
stop signals, the workdir lock, the run log), and what reads a run back
(inference: `compressive.load`; export: parameters only).
"""
