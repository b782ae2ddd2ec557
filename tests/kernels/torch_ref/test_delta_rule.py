"""The delta-rule twins against a plain token-by-token loop: the chunked prefill form (lengths around the chunk
size, with and without a starting state, grouped heads), the recurrent decode form over slots in any order, and
the causal conv1d with its rolling window."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels import ops
from kernels.torch_ref import delta_rule


def loop_delta_rule(q, k, v, g, beta, state):
    """The rule as written: per token, decay S, write beta (v - S^T k) along k, read S^T q. float64 throughout."""
    q, k = delta_rule.l2norm(q.double()), delta_rule.l2norm(k.double())
    group = v.shape[1] // q.shape[1]
    q, k = q.repeat_interleave(group, dim=1) * q.shape[-1] ** -0.5, k.repeat_interleave(group, dim=1)
    s = state.double().clone()  # [heads, key_dim, value_dim]
    out = []
    for t in range(v.shape[0]):
        s = s * g[t].double().exp()[:, None, None]
        predicted = torch.einsum("hkv,hk->hv", s, k[t])
        s = s + torch.einsum("hk,hv->hkv", k[t], (v[t].double() - predicted) * beta[t].double()[:, None])
        out.append(torch.einsum("hkv,hk->hv", s, q[t]))
    return torch.stack(out), s


def inputs(n: int, num_k: int = 2, num_v: int = 4, key_dim: int = 8, value_dim: int = 12, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(n, num_k, key_dim, generator=gen)
    k = torch.randn(n, num_k, key_dim, generator=gen)
    v = torch.randn(n, num_v, value_dim, generator=gen)
    g = -F.softplus(torch.randn(n, num_v, generator=gen)) * 0.5  # log decays <= 0
    beta = torch.rand(n, num_v, generator=gen)
    return q, k, v, g, beta


@pytest.mark.parametrize("n", [1, 5, 63, 64, 65, 150])
@pytest.mark.parametrize("warm", [False, True])
def test_chunked_form_is_the_loop(n, warm):
    q, k, v, g, beta = inputs(n, seed=n)
    states = torch.zeros(3, 4, 8, 12)
    if warm:
        states[1] = torch.randn(4, 8, 12, generator=torch.Generator().manual_seed(9))
    start = states[1].clone()
    out = ops.gated_delta_rule_chunked(q, k, v, g, beta, states, 1)
    ref_out, ref_state = loop_delta_rule(q, k, v, g, beta, start)
    torch.testing.assert_close(out.double(), ref_out, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(states[1].double(), ref_state, atol=1e-4, rtol=1e-4)
    assert not states[0].any() and not states[2].any()  # other slots untouched


def test_chunks_in_a_row_equal_one_pass():
    q, k, v, g, beta = inputs(100, seed=3)
    one = torch.zeros(1, 4, 8, 12)
    whole = ops.gated_delta_rule_chunked(q, k, v, g, beta, one, 0)
    parts = torch.zeros(1, 4, 8, 12)
    outs = [
        ops.gated_delta_rule_chunked(q[a:b], k[a:b], v[a:b], g[a:b], beta[a:b], parts, 0)
        for a, b in ((0, 7), (7, 71), (71, 100))
    ]
    torch.testing.assert_close(torch.cat(outs), whole, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(parts, one, atol=1e-5, rtol=1e-5)


def test_recurrent_form_steps_each_sequence_from_its_slot():
    states = torch.randn(5, 4, 8, 12, generator=torch.Generator().manual_seed(1)) * 0.3
    before = states.clone()
    slots = torch.tensor([3, 0, 4])
    q, k, v, g, beta = inputs(3, seed=2)
    out = ops.gated_delta_rule_recurrent(q, k, v, g, beta, states, slots)
    for i, slot in enumerate(slots.tolist()):
        ref_out, ref_state = loop_delta_rule(
            q[i : i + 1], k[i : i + 1], v[i : i + 1], g[i : i + 1], beta[i : i + 1], before[slot]
        )
        torch.testing.assert_close(out[i].double(), ref_out[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(states[slot].double(), ref_state, atol=1e-5, rtol=1e-5)
    for slot in (1, 2):
        assert torch.equal(states[slot], before[slot])


def test_decode_continues_a_prefill():
    q, k, v, g, beta = inputs(20, seed=4)
    states = torch.zeros(2, 4, 8, 12)
    out = [ops.gated_delta_rule_chunked(q[:17], k[:17], v[:17], g[:17], beta[:17], states, 1)]
    for t in range(17, 20):
        s = slice(t, t + 1)
        out.append(ops.gated_delta_rule_recurrent(q[s], k[s], v[s], g[s], beta[s], states, torch.tensor([1])))
    ref_out, ref_state = loop_delta_rule(q, k, v, g, beta, torch.zeros(4, 8, 12))
    torch.testing.assert_close(torch.cat(out).double(), ref_out, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(states[1].double(), ref_state, atol=1e-4, rtol=1e-4)


def loop_conv(x, weight, window):
    """y_t = silu(sum_j w[:, j] * input[t - (K - 1) + j]), the inputs before x taken from `window`."""
    seq = torch.cat((window.T, x))  # [width + n, C]
    kernel = weight.shape[1]
    y = torch.stack([(seq[t : t + kernel].T * weight).sum(-1) for t in range(x.shape[0])])
    return F.silu(y), seq[seq.shape[0] - (kernel - 1) :].T


def test_conv_prefill_and_steps_are_the_loop():
    gen = torch.Generator().manual_seed(5)
    channels, kernel = 10, 4
    weight = torch.randn(channels, kernel, generator=gen)
    x = torch.randn(9, channels, generator=gen)
    states = torch.zeros(3, channels, kernel - 1)
    states[2] = torch.randn(channels, kernel - 1, generator=gen)
    start = states[2].clone()
    y = [ops.causal_conv1d(x[:6], weight, states, 2)]
    for t in range(6, 9):
        y.append(ops.causal_conv1d_update(x[t : t + 1], weight, states, torch.tensor([2])))
    ref, window = loop_conv(x, weight, start)
    torch.testing.assert_close(torch.cat(y), ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(states[2], window)
    assert not states[0].any() and not states[1].any()


def test_conv_prefill_shorter_than_the_window_keeps_older_inputs():
    gen = torch.Generator().manual_seed(6)
    weight = torch.randn(4, 4, generator=gen)
    states = torch.zeros(1, 4, 3)
    x = torch.randn(5, 4, generator=gen)
    for a, b in ((0, 2), (2, 3), (3, 5)):  # chunks of 2, 1 and 2 inputs
        ops.causal_conv1d(x[a:b], weight, states, 0)
    torch.testing.assert_close(states[0], x[2:].T)


def test_conv_update_steps_a_batch_of_slots():
    gen = torch.Generator().manual_seed(7)
    weight = torch.randn(6, 3, generator=gen)
    states = torch.randn(4, 6, 2, generator=gen)
    before = states.clone()
    x = torch.randn(2, 6, generator=gen)
    y = ops.causal_conv1d_update(x, weight, states, torch.tensor([2, 0]))
    for i, slot in enumerate((2, 0)):
        ref, window = loop_conv(x[i : i + 1], weight, before[slot])
        torch.testing.assert_close(y[i : i + 1], ref, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(states[slot], window)
    assert torch.equal(states[1], before[1]) and torch.equal(states[3], before[3])
