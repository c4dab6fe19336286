"""``nki.isa`` names the simulator does not model: NeuronCore-v4 instructions (MX matmul and
quantisation, activate2, exponential, rand2, the random-state pair, topk, sequence_bounds,
nonzero_with_count), cross-partition local_gather and the collective sendrecv. Each raises
``UnsupportedError`` when called."""

from __future__ import annotations

from ..errors import UnsupportedError

NAMES = ("activate2", "exponential", "rand2", "sequence_bounds", "topk", "rand_set_state",
         "rand_get_state")


def _unsupported(name):
    def fn(*args, **kwargs):
        raise UnsupportedError(f"nisa.{name} is not supported by the simulator")
    fn.__name__ = name
    fn.__qualname__ = name
    return fn


activate2 = _unsupported("activate2")
exponential = _unsupported("exponential")
rand2 = _unsupported("rand2")
sequence_bounds = _unsupported("sequence_bounds")
topk = _unsupported("topk")
rand_set_state = _unsupported("rand_set_state")
rand_get_state = _unsupported("rand_get_state")
