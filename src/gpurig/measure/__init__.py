"""Micro-benchmarks behind ``gpurig bench``, one module each.

- :mod:`gpurig.measure.comm` — collectives and point-to-point, run on every rank of a job
- :mod:`gpurig.measure.local` — GEMM by batch size, host↔device copies, data loading, disk reads
"""
