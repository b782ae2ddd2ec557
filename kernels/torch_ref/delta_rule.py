"""The gated delta rule and its short causal convolution, in plain torch: the twins of the linear-attention kernels.

A Gated DeltaNet layer (Qwen3.5, Qwen3-Next) keeps two pieces of state per sequence, in slots of a pool that the
cache owns (engine/cache/recurrent.py):

    conv window   [conv_dim, width]        the last `width` = kernel - 1 inputs of its depthwise causal conv1d
    delta state   [heads, key_dim, value_dim]  float32: the fast-weight matrix S of the delta rule

Per token t and value head h (k and q L2-normalized, q scaled by key_dim ** -0.5; a key head serves
num_v_heads / num_k_heads consecutive value heads):

    S = exp(g_t) * S                     decay (g_t <= 0, log space)
    S = S + k_t (beta_t * (v_t - S^T k_t))^T   write the part of v_t that S does not already predict
    o_t = S^T q_t

Prefill (many tokens of one sequence) runs the chunked form: 64 tokens at a time, the writes inside a chunk
solved as one triangular system (the UT transform), so the work is matmuls. Decode (one token for each of many
sequences) runs the recurrent form above. Both read and write the pool in place at the sequences' slots, as the
kernels that take their place will. Every op computes in float32 and returns the value dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK = 64  # tokens per chunk of the chunked form (transformers' and FLA's size)


def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, conv_states: torch.Tensor, slot: int) -> torch.Tensor:
    """SiLU of the depthwise causal conv of x [n, conv_dim] (one sequence's new inputs) with weight [conv_dim,
    kernel], continuing the window conv_states[slot] [conv_dim, kernel - 1]; the window then holds the last
    kernel - 1 inputs. Returns [n, conv_dim] in x's dtype."""
    width = weight.shape[1] - 1
    seq = torch.cat((conv_states[slot].to(weight.dtype), x.T.to(weight.dtype)), dim=1)  # [conv_dim, width + n]
    if width:
        conv_states[slot].copy_(seq[:, seq.shape[1] - width :])
    y = F.conv1d(seq[None], weight[:, None, :], groups=weight.shape[0])[0]  # [conv_dim, n]
    return F.silu(y).T.to(x.dtype)


def causal_conv1d_update(
    x: torch.Tensor, weight: torch.Tensor, conv_states: torch.Tensor, slots: torch.Tensor
) -> torch.Tensor:
    """One new input per sequence: x [batch, conv_dim], sequence i's window at conv_states[slots[i]]. Returns
    [batch, conv_dim] (SiLU applied) and moves each window on by one input."""
    window = conv_states[slots].to(weight.dtype)  # [batch, conv_dim, width]
    seq = torch.cat((window, x.to(weight.dtype)[:, :, None]), dim=2)  # [batch, conv_dim, kernel]
    if window.shape[2]:
        conv_states[slots] = seq[:, :, 1:].to(conv_states.dtype)
    return F.silu((seq * weight[None]).sum(-1)).to(x.dtype)


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dim (FLA's and transformers' form)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def _prepare(q, k, g, beta, num_v_heads: int):
    """float32 q (normalized and scaled) and k (normalized), one per value head; float32 g and beta."""
    q, k = l2norm(q.float()), l2norm(k.float())
    if q.shape[-2] != num_v_heads:  # each key head serves the value heads that follow it
        q = q.repeat_interleave(num_v_heads // q.shape[-2], dim=-2)
        k = k.repeat_interleave(num_v_heads // k.shape[-2], dim=-2)
    return q * q.shape[-1] ** -0.5, k, g.float(), beta.float()


def gated_delta_rule_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    states: torch.Tensor,
    slot: int,
) -> torch.Tensor:
    """One sequence's new tokens: q, k [n, num_k_heads, key_dim], v [n, num_v_heads, value_dim], g (log decay) and
    beta [n, num_v_heads]; its state states[slot] [num_v_heads, key_dim, value_dim] (float32) is read, then
    replaced by the state after the last token. Returns o [n, num_v_heads, value_dim] in v's dtype."""
    n, num_heads, value_dim = v.shape
    q, k, g, beta = _prepare(q, k, g, beta, num_heads)
    # [heads, tokens, dim] per head; padded to whole chunks (padding has g = 0, beta = 0: it writes nothing)
    q, k, vf = (t.transpose(0, 1) for t in (q, k, v.float()))
    g, beta = g.T, beta.T
    pad = -n % CHUNK
    q, k, vf = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, vf))
    g, beta = F.pad(g, (0, pad)), F.pad(beta, (0, pad))
    num_chunks = (n + pad) // CHUNK

    def chunks(t):  # [heads, tokens, ...] -> [heads, num_chunks, CHUNK, ...]
        return t.reshape(num_heads, num_chunks, CHUNK, *t.shape[2:])

    k_beta, v_beta = k * beta[..., None], vf * beta[..., None]
    q, k, k_beta, v_beta, g = chunks(q), chunks(k), chunks(k_beta), chunks(v_beta), chunks(g)
    decay = g.cumsum(-1)  # [heads, chunks, CHUNK]: log of the decay from the chunk's start to each token
    future = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device).triu(1)
    pair_decay = (decay[..., :, None] - decay[..., None, :]).masked_fill(future, float("-inf")).exp()
    # The writes of a chunk depend on each other through S; solving (I + A) X = B with A's strictly lower part
    # (beta_i k_i . k_j, decayed) gives every token's correction at once.
    system = (k_beta @ k.transpose(-1, -2)) * pair_decay
    u = torch.linalg.solve_triangular(system, v_beta, upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(system, k_beta * decay.exp()[..., None], upper=False, unitriangular=True)
    inner = (q @ k.transpose(-1, -2)) * pair_decay
    q_decayed = q * decay.exp()[..., None]
    k_to_end = k * (decay[..., -1:] - decay).exp()[..., None]
    chunk_decay = decay[..., -1].exp()[..., None, None]
    state = states[slot].float()
    out = torch.empty_like(u)
    for c in range(num_chunks):
        v_new = u[:, c] - w[:, c] @ state  # each token's write, less what the state before the chunk predicts
        out[:, c] = q_decayed[:, c] @ state + inner[:, c] @ v_new
        state = state * chunk_decay[:, c] + k_to_end[:, c].transpose(-1, -2) @ v_new
    states[slot].copy_(state)
    out = out.reshape(num_heads, num_chunks * CHUNK, value_dim)[:, :n]
    return out.transpose(0, 1).to(v.dtype)


def gated_delta_rule_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    states: torch.Tensor,
    slots: torch.Tensor,
) -> torch.Tensor:
    """One token per sequence: q, k [batch, num_k_heads, key_dim], v [batch, num_v_heads, value_dim], g and beta
    [batch, num_v_heads]; sequence i's state is states[slots[i]], updated in place. Returns o [batch, num_v_heads,
    value_dim] in v's dtype."""
    q, k, g, beta = _prepare(q, k, g, beta, v.shape[1])
    state = states[slots].float() * g.exp()[..., None, None]  # [batch, heads, key_dim, value_dim]
    predicted = (state * k[..., None]).sum(-2)  # S^T k
    delta = (v.float() - predicted) * beta[..., None]
    state = state + k[..., None] * delta[..., None, :]
    states[slots] = state.to(states.dtype)
    return (state * q[..., None]).sum(-2).to(v.dtype)
