"""Hardware descriptions: the catalog (GPUs, PCIe, GPU links, networks), cluster specs and build files.

Model descriptions are in :mod:`gpurig.models.describe` (imported on its own: it needs torch).

>>> from gpurig import spec
>>> spec.gpu("2080ti").memory_gb
11.0
>>> spec.parse_description("4 V100, PCIe 3.0 x16").total_gpus
4
"""

from gpurig.spec.catalog import gpu, gpus, network, networks, pcie_generation
from gpurig.spec.cluster import CPU, NIC, ClusterSpec, Disk, NodeSpec, load_spec, save_spec, spec_from
from gpurig.spec.describe import parse_description
from gpurig.spec.fields import SpecError
from gpurig.spec.hardware import GPU, GPULink, Network, PCIeGeneration

__all__ = ["gpu", "gpus", "network", "networks", "pcie_generation", "CPU", "NIC", "ClusterSpec", "Disk", "NodeSpec",
           "load_spec", "save_spec", "spec_from", "parse_description", "SpecError", "GPU", "GPULink", "Network",
           "PCIeGeneration"]
