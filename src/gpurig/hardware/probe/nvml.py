"""NVIDIA GPUs through NVML (nvidia-ml-py): what each GPU is and how it is connected, right now.

Per GPU: name, memory, PCIe generation and width (current and maximum: a card
in an x4 slot, or one that trained down its link, shows here), temperature,
clocks, power, throttle reasons, active NVLinks; between GPUs: peer-to-peer
support and the PCIe topology. Every NVML call is guarded: fields a GPU does
not support are None. Without the NVIDIA driver, :func:`gpus` says why.
"""

from __future__ import annotations

# Throttle ("clocks event") reason bits, as nvml.h defines them.
THROTTLE_REASONS = {
    0x1: "idle", 0x2: "application clocks setting", 0x4: "software power cap", 0x8: "hardware slowdown",
    0x10: "sync boost", 0x20: "software thermal slowdown", 0x40: "hardware thermal slowdown",
    0x80: "hardware power brake", 0x100: "display clock setting",
}
TOPOLOGY = {0: "same board", 10: "same PCIe switch", 20: "PCIe switches", 30: "same CPU (host bridge)",
            40: "same NUMA node", 50: "across CPUs (SMP link)"}


def throttle_names(mask: int) -> list[str]:
    """Names of the throttle reasons set in ``mask``.

    >>> throttle_names(0x4 | 0x40)
    ['software power cap', 'hardware thermal slowdown']
    """
    return [name for bit, name in THROTTLE_REASONS.items() if mask & bit]


def _call(fn, *args):
    import pynvml

    try:
        value = fn(*args)
    except pynvml.NVMLError:
        return None
    return value.decode() if isinstance(value, bytes) else value


def _device(nv, handle) -> dict:
    mem = _call(nv.nvmlDeviceGetMemoryInfo, handle)
    reasons_fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
        nv.nvmlDeviceGetCurrentClocksThrottleReasons
    reasons = _call(reasons_fn, handle)
    power_mw = _call(nv.nvmlDeviceGetPowerUsage, handle)
    limit_mw = _call(nv.nvmlDeviceGetEnforcedPowerLimit, handle)
    links = []
    for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
        state = _call(nv.nvmlDeviceGetNvLinkState, handle, link)
        if state is None:
            break
        if state:
            links.append({"link": link, "version": _call(nv.nvmlDeviceGetNvLinkVersion, handle, link)})
    pci = _call(nv.nvmlDeviceGetPciInfo, handle)
    return {
        "name": _call(nv.nvmlDeviceGetName, handle),
        "memory_gb": round(mem.total / 2**30, 1) if mem else None,
        "pcie_gen": _call(nv.nvmlDeviceGetCurrPcieLinkGeneration, handle),
        "pcie_gen_max": _call(nv.nvmlDeviceGetMaxPcieLinkGeneration, handle),
        "pcie_width": _call(nv.nvmlDeviceGetCurrPcieLinkWidth, handle),
        "pcie_width_max": _call(nv.nvmlDeviceGetMaxPcieLinkWidth, handle),
        "temperature_c": _call(nv.nvmlDeviceGetTemperature, handle, nv.NVML_TEMPERATURE_GPU),
        "sm_clock_mhz": _call(nv.nvmlDeviceGetClockInfo, handle, nv.NVML_CLOCK_SM),
        "sm_clock_max_mhz": _call(nv.nvmlDeviceGetMaxClockInfo, handle, nv.NVML_CLOCK_SM),
        "memory_clock_mhz": _call(nv.nvmlDeviceGetClockInfo, handle, nv.NVML_CLOCK_MEM),
        "power_w": power_mw / 1000 if power_mw is not None else None,
        "power_limit_w": limit_mw / 1000 if limit_mw is not None else None,
        "throttle_reasons": throttle_names(reasons) if reasons is not None else None,
        "nvlinks": links,
        "bus_id": (pci.busId.decode() if isinstance(pci.busId, bytes) else pci.busId) if pci else None,
    }


def _pairs(nv, handles) -> list[dict]:
    out = []
    p2p_read = getattr(nv, "NVML_P2P_CAPS_INDEX_READ", 0)
    for i, a in enumerate(handles):
        for j, b in enumerate(handles):
            if j <= i:
                continue
            status = _call(nv.nvmlDeviceGetP2PStatus, a, b, p2p_read)
            level = _call(nv.nvmlDeviceGetTopologyCommonAncestor, a, b)
            out.append({"gpus": [i, j], "p2p": status == getattr(nv, "NVML_P2P_STATUS_OK", 0) if status is not None
                        else None, "topology": TOPOLOGY.get(level, level)})
    return out


def gpus() -> dict:
    """``{"available": bool, "reason": str | None, "driver": ..., "gpus": [...], "pairs": [...]}``.

    >>> info = gpus(); isinstance(info["gpus"], list)
    True
    """
    try:
        import pynvml as nv
    except ImportError:
        return {"available": False, "reason": "nvidia-ml-py is not installed", "gpus": [], "pairs": []}
    try:
        nv.nvmlInit()
    except nv.NVMLError as error:
        return {"available": False, "reason": f"no NVIDIA driver / NVML ({error})", "gpus": [], "pairs": []}
    try:
        handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
        return {"available": bool(handles), "reason": None if handles else "NVML reports no GPUs",
                "driver": _call(nv.nvmlSystemGetDriverVersion),
                "cuda_driver": _call(nv.nvmlSystemGetCudaDriverVersion),
                "gpus": [_device(nv, h) for h in handles], "pairs": _pairs(nv, handles)}
    finally:
        nv.nvmlShutdown()
