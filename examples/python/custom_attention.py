"""Example 2 of the DynamicPositionBias documentation ("Integration with
Transformer"), with its "... (implementation details)" written out:
nn.MultiheadAttention's own projections, the positional bias applied inside
posbias's fused attention (the [heads, 2j - 1] table, never an [heads, i, j]
tensor), the output projection. The result is checked against PyTorch's
MultiheadAttention given the same bias as a float attention mask, then one
training step shows the gradient reaching the bias's MLP."""
import torch
from torch.nn import MultiheadAttention
from posbias import DynamicPositionBias
import posbias


class CustomAttention(MultiheadAttention):
    def __init__(self, embed_dim, num_heads):
        super().__init__(embed_dim, num_heads)
        self.pos_bias = DynamicPositionBias(dim=embed_dim, heads=num_heads)

    # Override the forward method to include positional bias
    def forward(self, query, key, value, key_padding_mask=None, need_weights=False,
                attn_mask=None, average_attn_weights=True, causal=False):
        """query [L, N, E], key and value [S, N, E] (batch_first=False, as the
        parent's default); returns (output [L, N, E], None)."""
        if key_padding_mask is not None or attn_mask is not None or need_weights:
            raise ValueError("CustomAttention: masks and attention weights are not part of "
                             "this example (pass causal=True for a causal mask)")
        L, N, E = query.shape
        S = key.shape[0]
        h, d = self.num_heads, E // self.num_heads
        w_q, w_k, w_v = self.in_proj_weight.chunk(3)
        b_q, b_k, b_v = self.in_proj_bias.chunk(3)

        def heads(x, w, b):  # [len, N, E] -> [N, h, len, d]
            return torch.nn.functional.linear(x, w, b).reshape(x.shape[0], N, h, d).permute(
                1, 2, 0, 3)

        q, k, v = heads(query, w_q, b_q), heads(key, w_k, b_k), heads(value, w_v, b_v)
        out = posbias.attention(q, k, v, table=self.pos_bias.distance_table(S), causal=causal)
        out = out.permute(2, 0, 1, 3).reshape(L, N, E)
        return self.out_proj(out), None


torch.manual_seed(0)
embed_dim, num_heads, L, N = 64, 8, 12, 2
attn = CustomAttention(embed_dim, num_heads)
x = torch.randn(L, N, embed_dim)
out, _ = attn(x, x, x)
print(out.shape)

# The same computation through PyTorch's MultiheadAttention, with the bias as
# a float mask [N * heads, L, S] added to the scores.
with torch.no_grad():
    bias = attn.pos_bias(L, L)                                     # [heads, L, L]
    ref, _ = MultiheadAttention.forward(attn, x, x, x, need_weights=False,
                                        attn_mask=bias.repeat(N, 1, 1))
err = (out - ref).abs().max().item()
print(f"max |posbias - torch MultiheadAttention| = {err:.2e}")
assert err < 1e-4

# Causal, and a query chunk against a longer key sequence (bottom-right).
with torch.no_grad():
    causal_mask = torch.triu(torch.full((L, L), float("-inf")), diagonal=1)
    ref_c, _ = MultiheadAttention.forward(attn, x, x, x, need_weights=False,
                                          attn_mask=(bias + causal_mask).repeat(N, 1, 1))
    out_c, _ = attn(x, x, x, causal=True)
assert (out_c - ref_c).abs().max().item() < 1e-4

# One training step: the gradient reaches the DynamicPositionBias MLP.
opt = torch.optim.SGD(attn.parameters(), lr=0.1)
target = torch.randn(L, N, embed_dim)
loss = ((attn(x, x, x, causal=True)[0] - target) ** 2).mean()
loss.backward()
g = attn.pos_bias.mlp[4].weight.grad
print(f"loss {loss.item():.4f}, |grad mlp.4.weight| = {g.norm().item():.3e}")
assert g is not None and g.norm().item() > 0
opt.step()
