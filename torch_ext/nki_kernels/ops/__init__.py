"""The op modules. Importing this package registers every op (``registry.ops()``), in
this order: attention, norms, activations, softmax, rotary."""

from . import attention, norms, activations, softmax, rotary  # noqa: F401,I001  (registers the ops)
