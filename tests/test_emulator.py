"""Emulated nodes: namespaces, a real rate limit, both engines, clean teardown after failures."""

import json
import os
import re
import subprocess
import sys

import pytest

from conftest import gpurig
from gpurig.launch.emulator import unavailable

REASON = unavailable()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"network namespaces unavailable: {REASON}")

# 8 MB allreduced between 2 nodes moves 8 MB each way: at 100 Mbit/s that takes at least 0.64 s.
PROBE = """
import os, socket, time, torch, gpurig
c = gpurig.init()
t = torch.ones(2_000_000)
c.allreduce(t.clone())
start = time.perf_counter(); c.allreduce(t, op="sum"); seconds = time.perf_counter() - start
os.write(1, f"RESULT {c.rank} {socket.gethostname()} {t[0].item():.0f} {seconds:.3f}\\n".encode())  # one write: ranks share stdout
"""


def our_namespaces() -> list[str]:
    """gpurig's namespaces whose emulator has ended: left behind. (A namespace of an emulator still running
    belongs to another job on this machine, such as a benchmark beside the suite.)"""
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    names = [line.split()[0] for line in listing.splitlines() if line.startswith("gpurig")]
    owners = {n: re.match(r"gpurig(\d+)", n).group(1) for n in names}
    return [n for n in names if not os.path.exists(f"/proc/{owners[n]}")]


def results(stdout: str) -> list[list[str]]:
    return sorted(line.split()[1:] for line in stdout.splitlines() if line.startswith("RESULT"))


@pytest.mark.parametrize("engine", ["mpi", "torch"])
def test_two_nodes_behind_a_100_mbit_link(engine):
    done = gpurig("emulate", "--nodes", 2, "--rate", "100mbit", "--engine", engine, "--",
                  sys.executable, "-c", PROBE, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = results(done.stdout)
    assert [(r[0], r[1], r[2]) for r in rows] == [("0", "node1", "2"), ("1", "node2", "2")], done.stdout
    assert all(float(r[3]) >= 0.6 for r in rows), rows  # the link, not loopback (which takes ~10 ms)
    assert our_namespaces() == []


def test_three_nodes_through_a_bridge_two_ranks_each():
    done = gpurig("emulate", "--nodes", 3, "--ranks-per-node", 2, "--rate", "1gbit", "--",
                  sys.executable, "-c", PROBE, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = results(done.stdout)
    assert [r[1] for r in rows] == ["node1", "node1", "node2", "node2", "node3", "node3"]
    assert all(r[2] == "6" for r in rows)
    assert our_namespaces() == []


@pytest.mark.parametrize("engine", ["mpi", "torch"])
def test_a_failing_rank_ends_the_job_and_the_network_goes(engine):
    script = "import gpurig, sys, time; c = gpurig.init(); c.barrier()\nif c.rank == 1: sys.exit(3)\nc.barrier(); time.sleep(600)"
    done = gpurig("emulate", "--nodes", 2, "--engine", engine, "--", sys.executable, "-c", script, timeout=90)
    assert done.returncode == 3, done.stderr[-2000:]
    assert "rank 1 on host node2" in done.stderr.strip().splitlines()[-1], done.stderr[-2000:]
    # Open MPI's own account of the lost peer (a framed block, its error handler's "***" lines) stays off the screen
    assert "***" not in done.stderr and "unexpectedly disconnected" not in done.stderr, done.stderr[-2000:]
    assert our_namespaces() == []


@pytest.mark.parametrize("args,message", [
    (["--nodes", "1", "--", "true"], "--nodes must be from 2 to"),
    (["--rate", "fast", "--", "true"], "use a tc rate"),
    (["--engine", "nccl", "--", "true"], "unknown engine"),
    ([], "no command to run"),
    (["--", "no-such-command-here"], "command not found: no-such-command-here"),
    (["--rate", "5000gbit", "--", "true"], "want at most 1000gbit"),
    (["--", sys.executable, "-m", "gpurig", "run", "--", "true"], "not gpurig run"),
])
def test_bad_input(args, message):
    done = gpurig("emulate", *args, timeout=30)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr


def test_a_rank_that_is_not_python_is_named_by_its_node():
    """A torch rank's wrapper watches it from outside its namespace: it named this machine, not the node."""
    done = gpurig("emulate", "--nodes", 2, "--engine", "torch", "--", "false", timeout=60)
    assert done.returncode == 1, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert lines and all(re.search(r"on host node[12]\b", line) for line in lines), lines


def test_sigterm_ends_the_job_and_the_network_goes(marker):
    """`timeout N gpurig emulate ...` (CI's way) sends SIGTERM to emulate alone: it left the namespaces, the inner
    launcher and the ranks running."""
    import signal
    import time

    from conftest import leftovers

    script = f"import gpurig, time; c = gpurig.init(); c.barrier(); print('up', flush=True); time.sleep(600)  # {marker}"
    job = subprocess.Popen([sys.executable, "-m", "gpurig", "emulate", "--nodes", "2", "--", sys.executable, "-c",
                            script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert job.stdout.readline().strip() == "up", job.stderr.read()[-2000:] if job.poll() is not None else ""
        job.send_signal(signal.SIGTERM)
        code = job.wait(timeout=60)
        err = job.stderr.read()
    finally:
        job.kill()
    assert code == 143 and "stopped by SIGTERM" in err and "Traceback" not in err, err[-2000:]
    time.sleep(1)
    assert our_namespaces() == [] and leftovers(marker, wait=10) == []


def test_auto_compression_turns_on_behind_a_slow_link(tmp_path):
    done = gpurig("emulate", "--nodes", 2, "--rate", "100mbit", "--", sys.executable, "-m", "gpurig", "train",
                  "--epochs", 1, "--json", "--checkpoint-dir", tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout[done.stdout.index("{"):])
    choice = summary["compression_choice"]
    # rank-4 factors, 1 % of the bytes, win when the link is the bottleneck; int8 sends 25 times more
    assert choice["codec"] == "powersgd", choice
    assert choice["methods"] == ["powersgd"] * len(choice["methods"]), choice  # every bucket: none hides at 100 Mbit/s
    assert choice["bandwidth_gbit_s"] < 0.2, choice  # what the model inferred from the wait: the 0.1 Gbit/s link
    # (each bucket's real lead, a few ms of backward; on a loaded machine a collective can cost a scheduling delay)
    assert choice["chosen_ms"] < choice["none_ms"] / 5, choice
    assert summary["predicted"]["compression"] == "powersgd" and summary["predicted"]["comm_ms"] > 0
    # priced from the whole compressed averages auto could choose, timed in the job behind the same link:
    # int8's 1 M values take at least their bytes' time at 0.1 Gbit/s (each rank sends ~1 MB: half in the
    # all-to-all, half in the allgather)
    engine = json.loads((tmp_path / "profile.json").read_text())["comm"]["engines"]["mpi"]
    assert {"compressed:fp16", "compressed:int8", "compressed:powersgd"} <= set(engine), sorted(engine)
    assert engine["compressed:int8"]["rows"][-1]["seconds"] > 2**20 * 8 / 1e8 * 0.9, engine["compressed:int8"]
    assert summary["test_accuracy"] > 0.8


def test_namespaces_of_a_killed_emulator_are_swept():
    from gpurig.launch.emulator import Cluster, remove_orphans

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    orphan = Cluster(nodes=2, rate="1gbit", owner=int(dead.stdout))  # as if that process had been SIGKILLed
    orphan._up()
    assert len(our_namespaces()) == 2
    assert sorted(remove_orphans()) == sorted(orphan.namespaces)
    assert our_namespaces() == []


# The link slows down under a running job: every rank limits its node's outgoing traffic to 100 Mbit/s mid-run.
RATE_CHANGE = """
import json, os, torch, gpurig
from gpurig.launch.emulator import set_rate
c = gpurig.init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
                            torch.nn.Linear(512, 10))
dp = gpurig.DataParallel(model, compression="auto:fp16,int8")
dp.auto_review_steps = 5
opt = torch.optim.SGD(dp.parameters(), lr=0.01)
x = torch.randn(32, 256, generator=torch.Generator().manual_seed(c.rank))

def step():
    opt.zero_grad()
    dp(x).square().mean().backward()
    opt.step()

for _ in range(40):
    step()
fast = dict(dp.auto_choice)
set_rate("100mbit")
changed_at = dp.stats.steps
for _ in range(200):  # it ends at the new decision (~20 steps); the bound is for a loaded machine, whose noise can
    step()              # have doubled the review interval (decisions that changed nothing) during the fast part
    if dp.auto_choice["step"] > changed_at and not dp._trials:
        break
same = all(bool((w == w[0]).all()) for w in (c.allgather(p.detach().reshape(1, -1)) for p in dp.parameters()))
os.write(1, ("RESULT " + json.dumps({"rank": c.rank, "fast": fast, "slow": dp.auto_choice, "changed_at": changed_at,
                                     "same": same}) + "\\n").encode())
"""


def test_auto_decides_again_when_the_link_slows_down():
    done = gpurig("emulate", "--nodes", 2, "--rate", "10gbit", "--", sys.executable, "-c", RATE_CHANGE, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    runs = [json.loads(line.split(" ", 1)[1]) for line in done.stdout.splitlines() if line.startswith("RESULT")]
    assert len(runs) == 2 and all(run["same"] for run in runs), done.stdout  # training went on in step
    fast, slow = runs[0]["fast"], runs[0]["slow"]
    assert runs[1]["slow"]["methods"] == slow["methods"], runs  # every rank chose the same
    # decided again, from the steps' own waits, after the change, and measured the new link
    assert slow["decisions"] > fast["decisions"] and slow["step"] > runs[0]["changed_at"], (fast, slow)
    assert "moved" in slow["reason"] and slow["bandwidth_gbit_s"] < 0.2 < fast["bandwidth_gbit_s"], slow
    assert "none" not in slow["methods"], slow  # nothing hides 0.5-1 MB buckets behind 100 Mbit/s
    assert our_namespaces() == []
