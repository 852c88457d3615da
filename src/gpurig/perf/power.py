"""Power: the PSU a build needs, the energy a run uses, and what a PSU's efficiency costs.

gpurig's PSU rule is the hardware guide's summary: **(sum of GPU TDPs + CPU TDP)
× 1.1, rounded up to the next 50 W**. The guide's worked example reaches its
number differently (adds 100 W, then another 10 %: 1375 → 1400 W); the same
function gives all of the guide's versions from their parameters
(docs/hardware.md, tests/test_perf.py).
"""

from __future__ import annotations

import math

PSU_HEADROOM = 0.10     # the guide's "multiply the total by 110 %"
PSU_STEP_W = 50         # PSUs are sold in 50 W steps up to 1000 W and 100-200 W steps above; 50 W covers both


def psu_watts(gpu_tdps_w: list[float], cpu_tdp_w: float, other_w: float = 0.0, headroom: float = PSU_HEADROOM) -> float:
    """Watts a PSU must deliver: (GPU TDPs + CPU TDP + other parts) × (1 + headroom).

    >>> round(psu_watts([250] * 4, 150), 1)                    # gpurig's rule (the guide's summary)
    1265.0
    >>> psu_watts([250] * 4, 150, other_w=100, headroom=0.0)   # the guide's example, before its extra 10 %
    1250.0
    """
    if headroom < 0 or other_w < 0 or cpu_tdp_w < 0 or any(w < 0 for w in gpu_tdps_w):
        raise ValueError("watts and headroom must not be negative")
    return (sum(gpu_tdps_w) + cpu_tdp_w + other_w) * (1 + headroom)


def psu_size(watts: float, step_w: float = PSU_STEP_W) -> int:
    """The PSU to buy: ``watts`` rounded up to the next ``step_w``.

    >>> psu_size(1265), psu_size(1375), psu_size(1400)
    (1300, 1400, 1400)
    """
    return int(math.ceil(round(watts, 6) / step_w) * step_w)


def energy_kwh(watts: float, hours: float) -> float:
    """Energy a load of ``watts`` uses in ``hours``, in kWh.

    >>> energy_kwh(1000, 14 * 24), energy_kwh(1500, 14 * 24)     # the guide: 4 GPUs for two weeks
    (336.0, 504.0)
    """
    return watts * hours / 1000


def wall_energy_kwh(watts: float, hours: float, psu_efficiency: float = 1.0) -> float:
    """Energy drawn from the wall when the parts use ``watts`` behind a PSU of ``psu_efficiency``.

    An 80 % efficient PSU draws 1 / 0.8 = 1.25 times what the parts use:

    >>> wall_energy_kwh(1000, 336, psu_efficiency=0.8)
    420.0
    """
    if not 0 < psu_efficiency <= 1:
        raise ValueError(f"PSU efficiency must be in (0, 1], got {psu_efficiency}")
    return energy_kwh(watts, hours) / psu_efficiency


def energy_cost(kwh: float, price_per_kwh: float) -> float:
    """Money for ``kwh`` at ``price_per_kwh``.

    >>> round(energy_cost(336, 0.20), 2)
    67.2
    """
    return kwh * price_per_kwh


def efficiency_surcharge(watts: float, hours: float, price_per_kwh: float, psu_efficiency: float) -> float:
    """What the PSU's losses add to a run's energy bill, against a lossless PSU.

    The guide: 1000 W for two weeks at 0.20 €/kWh behind an 80 % PSU. It says
    "an additional 18–26 €"; the arithmetic gives 16.8 € (and 25.2 € at 1500 W):

    >>> round(efficiency_surcharge(1000, 336, 0.20, 0.8), 2)
    16.8
    """
    lossless = energy_cost(energy_kwh(watts, hours), price_per_kwh)
    return energy_cost(wall_energy_kwh(watts, hours, psu_efficiency), price_per_kwh) - lossless
