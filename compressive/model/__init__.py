"""The model layer: the Compressive Transformer itself.

layers (dense, LayerNorm, feed-forward) -> attention (scores over
[compressed memory; memory; segment]) -> memory (the FIFO and compressed
banks) and compression (the registry of compression functions) -> losses ->
transformer (the network) -> sampling (decoding). `config` holds the typed
`ModelConfig` every module here reads. Nothing here knows about training,
evaluation, data or devices.
"""
