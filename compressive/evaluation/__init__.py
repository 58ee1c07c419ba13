"""The evaluation layer: a trained model's loss over whole documents, streamed
segment by segment with its memory threaded through (evaluate), and analysis
of what the memory holds and recalls (analysis). Training calls it every
`eval_every_steps`; so it sits below training.
"""
