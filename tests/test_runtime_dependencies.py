"""The shipped package needs only torch at run time: with numpy (and transformers, kernels,
huggingface_hub) unimportable, the ops run on both CPU backends; the cost model, which
needs numpy, says so by name."""

from __future__ import annotations

import subprocess
import sys
import textwrap

BLOCKED = ("numpy", "transformers", "kernels", "huggingface_hub")


def test_ops_and_simulator_run_without_numpy_and_the_cost_model_names_it(tmp_path):
    code = textwrap.dedent(f"""
        import os, sys
        # None in sys.modules: `import numpy` raises ModuleNotFoundError and
        # importlib.util.find_spec("numpy") returns None, as where numpy is not installed
        for name in {BLOCKED!r}:
            sys.modules[name] = None
        import torch, torch.nn.functional as F
        import nki_kernels
        x = torch.randn(5, 64)
        for backend in ("reference", "simulator"):
            os.environ["NKI_KERNELS_CPU_BACKEND"] = backend
            torch.testing.assert_close(nki_kernels.layer_norm(x, (64,)), F.layer_norm(x, (64,)), atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(nki_kernels.gelu(x), F.gelu(x), atol=1e-5, rtol=1e-4)
        try:
            import nki_kernels.simulator.cost
        except ImportError as e:
            print("cost:", e)
        print("numpy loaded:", sys.modules.get("numpy") is not None)
    """)
    run = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True,
                         cwd=tmp_path, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "cost: nki_kernels.simulator.cost (the cost model behind simulator.estimate) needs numpy" in run.stdout
    assert "numpy loaded: False" in run.stdout
