"""``nki.isa`` names the simulator does not model: the NeuronCore-v4 activate2, rand2 and the
random-state pair, and GpSimd topk (no nki-library or nki-samples kernel calls them; topk's
16-partition "snake" input layout and the v4 random generator are not specified enough to
reproduce). Each raises ``UnsupportedError`` when called."""

from __future__ import annotations

from ..errors import UnsupportedError

NAMES = ("activate2", "rand2", "topk", "rand_set_state", "rand_get_state")


def _unsupported(name):
    def fn(*args, **kwargs):
        raise UnsupportedError(f"nisa.{name} is not supported by the simulator")
    fn.__name__ = name
    fn.__qualname__ = name
    return fn


activate2 = _unsupported("activate2")
rand2 = _unsupported("rand2")
topk = _unsupported("topk")
rand_set_state = _unsupported("rand_set_state")
rand_get_state = _unsupported("rand_get_state")
