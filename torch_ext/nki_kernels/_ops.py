"""Op namespace for the development tree.

The Hub build (tools/build_hub.py) regenerates this file with a unique namespace
``_nki_kernels_<backend>_<id>`` so that two loaded builds never register the same op.
"""

import torch

_OP_NAMESPACE = "_nki_kernels_dev"

ops = getattr(torch.ops, _OP_NAMESPACE)


def add_op_namespace_prefix(op_name: str) -> str:
    """Return ``"<namespace>::<op_name>"``, the name every custom op is registered under."""
    return f"{_OP_NAMESPACE}::{op_name}"
