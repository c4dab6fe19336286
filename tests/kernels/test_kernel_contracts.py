"""The kernels' own checks of their launch contract (the op layer validates first; these
guard a direct launch): each names the argument, its value and the limit."""

from __future__ import annotations

import pytest
import torch

from nki_kernels import _kernel_sources, simulator


def _kernel(module, name):
    with simulator.activated():
        return getattr(_kernel_sources.load(module, "simulator"), name)


def test_act_and_mul_kernels_refuse_an_odd_width_and_a_dy_of_another_shape():
    x = torch.randn(4, 7)
    with pytest.raises(AssertionError, match=r"x: last dim 7 is odd; it must be an even size 2d"):
        simulator.run(_kernel("activation_and_mul", "act_and_mul_kernel")[1], x, act="silu")
    backward = _kernel("activation_backward", "act_and_mul_backward_kernel")
    with pytest.raises(AssertionError, match=r"x: last dim 7 is odd"):
        simulator.run(backward[1], torch.randn(4, 3), x, act="silu")
    # the backward kernel checked neither (an odd width left dx's last column unwritten)
    with pytest.raises(AssertionError, match=r"dy shape \(3, 4\) must be \(4, 4\), half of x's \(4, 8\)"):
        simulator.run(backward[1], torch.randn(3, 4), torch.randn(4, 8), act="silu")


def test_attention_kernel_names_the_dtypes_it_cannot_mix():
    q = torch.randn(1, 2, 8, 16)
    k = torch.randn(1, 2, 8, 16, dtype=torch.float64).to(torch.bfloat16)
    with pytest.raises(AssertionError, match=r"q, k, v must share one dtype, got q float32, k bfloat16, v float32"):
        simulator.run(_kernel("attention", "attention_kernel")[1], q, k, q.clone(), None, scale=0.25, causal=False)
