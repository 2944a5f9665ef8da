"""The worked example of the "ALiBi" seed document with its AlibiBias builder
(the class of the document, imported from posbias instead of defined inline):
three tokens, slope -0.2, non-causal."""
import torch

from posbias import AlibiBias

# Step 1: attention scores before ALiBi
scores = torch.tensor([[1.0, 2.0, 3.0],
                       [2.0, 1.5, 2.5],
                       [3.0, 2.5, 1.2]])

# Step 2: ALiBi penalties, slope -0.2 (penalty = slope x distance)
alibi = AlibiBias(n_heads=1, causal=False, slopes=torch.tensor([-0.2]))
penalty = alibi.build(q_len=3, k_len=3)  # [1, n_heads, q_len, k_len]
print(penalty[0, 0])

# Step 3: add the penalties to the scores
biased = scores + penalty[0, 0]
print(biased)
expected = torch.tensor([[1.0, 1.8, 2.6],
                         [1.8, 1.5, 2.3],
                         [2.6, 2.3, 1.2]])
assert torch.allclose(biased, expected, atol=1e-6)

# The builder's defaults: 8 heads, causal, slopes linspace(-0.05, -0.5).
builder = AlibiBias(n_heads=8)
bias = builder.build(4, 6)
print(bias.shape, builder.slopes)
assert bias.shape == (1, 8, 4, 6)
