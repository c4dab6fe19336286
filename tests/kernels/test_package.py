"""kernels/ imported as a package: two flavours under private names, relative imports of
shared helpers, the simulator's nki bound without touching sys.modules, limits readable
with no toolchain."""

from __future__ import annotations

import subprocess
import sys

import pytest

from nki_kernels import _kernel_sources, simulator


def test_simulator_flavour_binds_the_simulated_nki_without_sys_modules():
    before = sys.modules.get("nki")
    mod = _kernel_sources.load("rms_norm", "simulator")
    assert mod.__name__ == "nki_kernels._nki_src_simulator.rms_norm"
    assert mod.nki is simulator.nki_modules()["nki"]
    assert mod.nl is simulator.nki_modules()["nki.language"]
    assert sys.modules.get("nki") is before          # nothing aliased globally
    # the shared helper module came through the same flavour, relatively imported
    tiling = sys.modules["nki_kernels._nki_src_simulator.tiling"]
    assert mod.program_row_blocks is tiling.program_row_blocks and tiling.nl is simulator.nki_modules()["nki.language"]


def test_neuron_flavour_is_a_real_package_name():
    limits = _kernel_sources.limits()
    assert limits.__name__ == "nki_kernels.nki_src.limits"
    assert sys.modules["nki_kernels.nki_src"].__path__ == [str(_kernel_sources.source_dir())]
    assert limits.NORM_MAX_HIDDEN > 0


def test_limits_need_no_toolchain():
    code = ("import sys\nsys.modules['nki'] = None\n"
            "from nki_kernels import _kernel_sources\nprint(_kernel_sources.limits().ATTENTION_MAX_HEAD_DIM)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "256"


def test_neuron_flavour_needs_the_real_toolchain():
    # Without AWS's nki installed, importing a kernel for the neuron flavour fails on
    # `import nki` (and never finds the simulator's).
    code = ("import sys\nsys.modules['nki'] = None\n"
            "from nki_kernels import _kernel_sources\n_kernel_sources.load('rms_norm', 'neuron')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert out.returncode != 0
    assert "import of nki halted" in out.stderr or "No module named 'nki'" in out.stderr, out.stderr


def test_errors_name_the_module_kernel_and_flavour():
    with pytest.raises(FileNotFoundError, match="'no_such_kernel' not found"):
        _kernel_sources.load("no_such_kernel", "simulator")
    with pytest.raises(ValueError, match="flavour='cuda'"):
        _kernel_sources.load("rms_norm", "cuda")
    with pytest.raises(AttributeError, match="has no kernel 'nope'"):
        _kernel_sources.kernel("rms_norm", "nope", "simulator")
