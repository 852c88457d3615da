"""The cost model: each formula once, in a module named by its topic.

- :mod:`gpurig.perf.transfer` — time to move bytes over PCIe, a disk or a network; shared links
- :mod:`gpurig.perf.power` — PSU watts, energy in kWh and money, PSU efficiency
- :mod:`gpurig.perf.busbw` — nccl-tests' algorithm and bus bandwidth of collectives
- :mod:`gpurig.perf.fit` — latency and bandwidth (alpha, beta) fitted to measured times

Units (bytes, bits, the meaning of "giga") are in :mod:`gpurig.units`, a leaf
module, because the spec layer below needs them too.

SEEDS.md's worked examples are tests of these general formulas (tests/test_perf.py).
"""
