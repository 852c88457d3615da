"""The GPU speeds ``gpurig plan`` quotes, from the cost model ``gpurig predict`` uses, so the two verbs agree.

The guide's examples, priced on the build's own GPUs: a ResNet-152 step at batch 32 (the guide's 216 ms was
its GPU's), what 16-bit does on a GPU (:mod:`gpurig.perf.precision`), and what a slower PCIe generation costs a
data-parallel convolutional net (the guide's "PCIe 2.0: about 15 % for a second GPU").
"""

from __future__ import annotations

from functools import lru_cache

from gpurig.perf.collectives import Link, Topology
from gpurig.perf.machine import LATENCY_S, LINK_EFFICIENCY, gpu_device
from gpurig.perf.optimizer import default_implementation
from gpurig.perf.step import DataParallelSetup, layer_costs, predict_step
from gpurig.perf.transfer import pcie_bytes_per_s

GUIDE_STEP = ("resnet152", 32)     # the guide's forward + backward example
CONVNET = ("alexnet", 128)         # a data-parallel convolutional net of the posts' time, per-GPU batch
OPTIMIZER_IMPL = default_implementation("current")   # as predict runs its default optimizer on a GPU


@lru_cache(maxsize=8)
def _layers(model: str, batch: int) -> tuple:
    from gpurig.models import model_spec

    return tuple(layer_costs(model_spec(model, batch=batch)))


def compute_seconds(gpu, model: str = GUIDE_STEP[0], batch: int = GUIDE_STEP[1], precision: str = "fp32") -> float:
    """Forward + backward + optimizer of ``model`` at ``batch`` on one ``gpu``: ``predict``'s compute part.

    >>> from gpurig.spec import catalog
    >>> compute_seconds(catalog.gpu("2080ti")) > compute_seconds(catalog.gpu("V100"))
    True
    """
    return predict_step(list(_layers(model, batch)), gpu_device(gpu, precision),
                       DataParallelSetup(optimizer_impl=OPTIMIZER_IMPL)).compute_s


def gpu_pcie_link(gen: str, lanes: int, pcie: Link | None = None) -> Link:
    """A GPU's PCIe link as the cost model prices it (``predict``'s ``spec_topology``).

    >>> round(gpu_pcie_link("3.0", 16).bytes_per_s / 1e9, 2)
    14.18
    """
    return pcie or Link(LATENCY_S["pcie"], pcie_bytes_per_s(gen, lanes) * LINK_EFFICIENCY)


def data_parallel_seconds(gpu, gpus: int, link: Link, model: str = CONVNET[0], batch: int = CONVNET[1]) -> float:
    """One data-parallel step of ``model`` (``batch`` per GPU) on ``gpus`` GPUs joined by ``link`` (a ring).

    >>> from gpurig.spec import catalog
    >>> slow, fast = (data_parallel_seconds(catalog.gpu("GTX Titan X"), 4, gpu_pcie_link(g, 16)) for g in ("2.0", "3.0"))
    >>> slow > fast
    True
    """
    topology = Topology(1, gpus, link, link)
    setup = DataParallelSetup(ranks=gpus, topology=topology, algorithm="ring", optimizer_impl=OPTIMIZER_IMPL)
    return predict_step(list(_layers(model, batch)), gpu_device(gpu), setup).step_s


def generation_cost(gpu, gpus: int, gen: str, lanes: int, better: str = "3.0") -> float:
    """How much longer a data-parallel convnet step is on PCIe ``gen`` than on ``better`` (0.15 = 15 % longer).

    >>> from gpurig.spec import catalog
    >>> generation_cost(catalog.gpu("GTX Titan X"), 1, "2.0", 16)
    0.0
    """
    if gpus < 2:
        return 0.0
    slow = data_parallel_seconds(gpu, gpus, gpu_pcie_link(gen, lanes))
    fast = data_parallel_seconds(gpu, gpus, gpu_pcie_link(better, lanes))
    return slow / fast - 1


__all__ = ["compute_seconds", "data_parallel_seconds", "generation_cost", "gpu_pcie_link"]
