"""The rewrite kinds' names, and the domain of the nodes they replace: the vocabulary that ops.rewrite
(which runs the rewrites) and each kind's module (ops.linear_attention, ops.attention, ...) share.
Here, below both, so that neither imports the other for it."""

SOURCE_DOMAIN = "com.microsoft"  # the domain of the nodes the rewrites replace (onnxruntime-genai's builder's)

MATMUL = "matmul"
LINEAR_ATTENTION = "linear-attention"
ATTENTION = "attention"
FLOAT_MATMUL = "float-matmul"
MLP = "mlp"
GATED_ATTENTION = "gated-attention"
NORM = "norm"
REWRITES = (MATMUL, LINEAR_ATTENTION, ATTENTION, FLOAT_MATMUL, MLP, GATED_ATTENTION, NORM)
"""The rewrite kinds (`python -m ops rewrite --only NAME`, the driver's rewrite=...)."""
