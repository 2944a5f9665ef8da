"""The three usage examples of the AlibiPositionalBias documentation (zeta),
unchanged apart from the import line (`from zeta import ...` ->
`from posbias import ...`), then a check of what they printed."""
# ### Example 1: Initialize and compute bias
from posbias import AlibiPositionalBias
import torch

bias_module = AlibiPositionalBias(heads=4, total_heads=8)
bias = bias_module(10, 10)
print(bias)

# ### Example 2: Retrieve stored bias
bias = bias_module(5, 5)
print(bias)

# ### Example 3: Computing bias for different dimensions
bias = bias_module(8, 15)
print(bias)

# --- not in the documentation: what the examples computed -----------------
# Heads 4..7 of total_heads=8 are zero; queries are the last 8 of 15 keys
# (bottom-right), so row r sits at position 7 + r.
assert bias.shape == (8, 8, 15)
slopes = bias_module.slopes
q_pos = torch.arange(7, 15)[:, None]
k_pos = torch.arange(15)[None, :]
expected = -slopes[:, None, None] * (k_pos - q_pos).abs()
assert torch.equal(bias[:4], expected)
assert torch.count_nonzero(bias[4:]) == 0
# Example 2 came from the stored [8, 10, 10] bias: its bottom-right block.
assert torch.equal(bias_module(5, 5), AlibiPositionalBias(heads=4, total_heads=8)(5, 5))
print("slopes:", slopes.tolist())
