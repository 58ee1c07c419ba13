"""The evaluation layer: streaming evaluation with a threaded memory,
analysis of a trained model, loading a workdir or export for use from Python
(`compressive.load`), and exports.
"""
