"""Examples 1 and 3 of the DynamicPositionBias documentation (zeta), unchanged
apart from the import line, then the picture example 3 announces.

Note (see docs/python.md): i and j are lengths, not positions, so the
documentation's module(0, 5) ("positions 0 to 5") is an empty [8, 0, 5]."""
import os
import sys
import tempfile

# ### 1. Basic Usage:
import torch
from posbias import DynamicPositionBias
# Initialize the module
module = DynamicPositionBias(dim=64, heads=8)
# Compute bias for positions 0 to 5
bias = module(0, 5)

print(bias.shape)
assert bias.shape == (8, 0, 5)

# ### 3. Inspecting the Bias:
import matplotlib.pyplot as plt
import torch
from posbias import DynamicPositionBias
# Initialize the module
module = DynamicPositionBias(dim=64, heads=8)
# Compute bias and visualize for positions 0 to 5
bias = module(0, 5)

# --- not in the documentation: the picture, of a 16 x 16 bias -------------
bias = module(16, 16)
fig, axes = plt.subplots(1, 8, figsize=(16, 2.5))
for h, ax in enumerate(axes):
    ax.imshow(bias[h].detach().numpy(), cmap="viridis")
    ax.set_title(f"head {h}")
    ax.axis("off")
out_dir = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()
path = os.path.join(out_dir, "dynamic_position_bias.png")
fig.savefig(path)
print("wrote", path)
assert os.path.getsize(path) > 0
# Toeplitz: each head's bias depends on |q - k| only.
assert torch.equal(bias[:, 1:, 1:], bias[:, :-1, :-1])
