"""The analytical cost model of a NeuronCore, driven by the simulator's instruction trace.

    from nki_kernels import simulator
    est = simulator.estimate(kernel, target="trn2")(x, y)     # runs the kernel, models its trace
    est.latency_us, est.engine_busy_us, est.bottleneck, est.to_chrome_trace("t.json")
    est = simulator.cost.estimate_trace(trace, "trn2")         # a trace you already have

Everything it reports is MODELED for the target, never measured. The model:

* model.py      per-instruction cost rules (cycles per engine, DMA fixed cost + bandwidth);
* schedule.py   a list schedule over the engines and the 16 DMA queues with read-after-
                write, write-after-read and write-after-write dependencies on overlapping
                parts of the same allocation (regions.py computes the footprints);
* estimate.py   the ``Estimate`` result, ``estimate_trace`` and the Chrome trace;
* uncertainty.py  error bars: the same trace at both ends of the uncertain numbers.

Per-op limits and modeled eager baselines live with the ops (``nki_kernels.roofline``).

All hardware numbers come from ``simulator/hardware.py``. docs/cost-model.md explains
the model and its assumptions.
"""

try:  # the ops and the simulator need only torch; the cost model's footprints need numpy
    import numpy  # noqa: F401
except ImportError as e:
    raise ImportError("nki_kernels.simulator.cost (the cost model behind simulator.estimate) needs numpy, "
                      "which the ops and the simulator do not: pip install numpy") from e

from .estimate import Estimate, estimate_trace
from .model import CostModelError, DmaCost, InstructionCost, compute_cost, dma_cost
from .schedule import Schedule, Slot, schedule
from .uncertainty import time_range, variant

__all__ = [
    "CostModelError",
    "DmaCost",
    "Estimate",
    "InstructionCost",
    "Schedule",
    "Slot",
    "compute_cost",
    "dma_cost",
    "estimate_trace",
    "schedule",
    "time_range",
    "variant",
]
