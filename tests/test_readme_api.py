"""The README's API block runs as written and computes what torch computes."""

from __future__ import annotations

import re
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]


def test_the_api_block_runs_as_written():
    text = (ROOT / "README.md").read_text()
    api = text[text.index("\n## API\n"):]
    block = re.search(r"```python\n(.*?)```", api, re.S).group(1)
    scope: dict = {}
    exec(compile(block, "README.md (API)", "exec"), scope)
    q, k, v, out = scope["q"], scope["k"], scope["v"], scope["out"]
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
    # bf16 inputs: P rounded to bf16 before P.V (README's numerics column) and one final rounding
    torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=2e-2)
    x, w, b, y = scope["x"], scope["weight"], scope["bias"], scope["y"]
    ref = F.layer_norm(x.double(), (x.shape[-1],), w.double(), b.double(), eps=1e-6)
    torch.testing.assert_close(y.double(), ref, atol=1e-5, rtol=1e-4)
