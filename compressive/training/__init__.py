"""The training layer: the jitted train step, the loop that drives it, and
what keeps a long run whole (checkpoints and their restore policy, stop
signals, the workdir lock, the run log).
"""
