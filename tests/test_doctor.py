"""gpurig doctor on this machine: no GPU is reported, not failed; the spec it writes loads back."""

import json

from conftest import gpurig as gpurig_cli
from conftest import run_cli
from gpurig.hardware.doctor import doctor, node_spec
from gpurig.spec import load_spec


def test_doctor_runs_here_and_writes_a_spec_that_loads(tmp_path):
    spec_path = tmp_path / "machine.toml"
    done = gpurig_cli("doctor", "--json", "--write-spec", spec_path, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    facts = report["facts"]
    assert facts["cpu"]["threads"] >= 1 and facts["ram_gb"] > 0
    rules = {v["rule"]: v for v in report["verdicts"]}
    if not facts["nvml"]["gpus"]:                          # this machine: no GPU, said so, still checked the rest
        assert rules["GPUs"]["number"] == "none" and "no GPU" in rules["GPUs"]["reason"]
        assert {"CPU clock", "RAM size", "storage"} <= set(rules)
    assert rules["MPI"]["verdict"] in ("ok", "warning")
    spec = load_spec(spec_path)
    assert spec.nodes[0] == node_spec(facts)
    assert spec.nodes[0].cpu.threads == facts["cpu"]["threads"]


def test_doctor_table_output(monkeypatch):
    monkeypatch.setenv("COLUMNS", "160")  # in this process: the console command runs in the test above
    code, out, err = run_cli(["doctor"])
    assert code == 0 and "gpurig doctor" in out and "MPI" in out, err


def test_doctor_checks_a_gpu_machine_from_facts():
    # NVML's answers on a 4-GPU machine with one card in a narrow slot and one running hot
    gpu = {"name": "NVIDIA GeForce RTX 2080 Ti", "memory_gb": 11.0, "pcie_gen": 1, "pcie_gen_max": 3,
           "pcie_width": 16, "pcie_width_max": 16, "temperature_c": 60, "sm_clock_mhz": 300,
           "sm_clock_max_mhz": 2100, "memory_clock_mhz": 405, "power_w": 20.0, "power_limit_w": 250.0,
           "throttle_reasons": ["idle"], "nvlinks": [], "bus_id": "0000:01:00.0"}
    narrow = {**gpu, "pcie_width": 4}
    hot = {**gpu, "temperature_c": 86, "throttle_reasons": ["software thermal slowdown"]}
    facts = {"hostname": "box", "cpu": {"model": "x", "cores": 4, "threads": 8, "ghz": 3.5}, "ram_gb": 64.0,
             "disks": [{"name": "nvme0n1", "kind": "ssd", "size_gb": 1000.0}], "nics": [],
             "nvml": {"available": True, "reason": None, "driver": "550", "gpus": [gpu, narrow, hot, gpu],
                      "pairs": [{"gpus": [0, 1], "p2p": True, "topology": "same CPU (host bridge)"}]},
             "mpi": {"present": True, "library": "Open MPI v5", "mpi4py": "4", "cuda_aware": False}}
    rules = {v["rule"]: v for v in doctor(facts)["verdicts"]}
    no_gpu = {**facts, "nvml": {**facts["nvml"], "gpus": [], "pairs": []}}
    assert doctor(no_gpu, use_case="kaggle")["skipped"] == [  # said, not taken and then ignored
        {"rule": "GPU memory", "needs": "a GPU the catalog knows, for --use-case kaggle", "node": None}]
    assert rules["GPU 1 PCIe link"]["verdict"] == "warning" and rules["GPU 0 PCIe link"]["verdict"] == "ok"
    assert rules["GPU 2 heat"]["verdict"] == "warning"
    assert rules["MPI"]["verdict"] == "warning"                       # GPUs but no CUDA-aware MPI
    assert rules["CPU threads"]["verdict"] == "warning"               # 8 threads for 4 GPUs preprocessing during
    assert rules["PCIe lanes"]["verdict"] == "warning"                # x4 with 4 GPUs
    spec = node_spec(facts)
    assert spec.gpus == 4 and spec.gpu.name == "GeForce RTX 2080 Ti" and spec.pcie_lanes == 4


def test_an_rdma_nic_is_told_infiniband_or_roce_by_its_link_layer(tmp_path):
    """A NIC with an RDMA device is InfiniBand or RoCE as its port's link layer says; a plain one is neither."""
    from gpurig.hardware.probe.system import _rdma_kind

    for name, layer in (("eth9", "Ethernet"), ("ib0", "InfiniBand")):
        port = tmp_path / name / "device" / "infiniband" / "mlx5_0" / "ports" / "1"
        port.mkdir(parents=True)
        (port / "link_layer").write_text(layer + "\n")
    (tmp_path / "eth1").mkdir()
    assert [_rdma_kind(tmp_path / n, n) for n in ("eth9", "ib0", "eth1")] == ["roce", "infiniband", None]
