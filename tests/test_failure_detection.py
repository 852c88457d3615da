"""Failure detection on both engines: a rank killed (SIGKILL) or stopped (SIGSTOP) ends the whole job in bounded time.

Real ranks under ``gpurig run`` call named allreduces in a loop; one of them
sends itself the signal at a chosen iteration. The job must end within the
failure timeout plus the time to stop the others, every rank gone, the last
line naming the rank, its host and the collective. A rank that is only slow (a
long step) must not be declared dead: the stall report names it instead.
"""

import json
import os
import socket
import sys
import time

import pytest


from conftest import gpurig, leftovers

HOST = socket.gethostname()
TIMEOUT_S = 3  # GPURIG_FAILURE_TIMEOUT in these jobs (10 by default)
ENDS_WITHIN_S = TIMEOUT_S + 15  # detection, then stopping the others (3 s grace) on a busy 2-core machine

LOOP = """
import json, os, signal, sys, time, torch, gpurig  # {marker}
victim, how, at, ready = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
comm = gpurig.init()
t = torch.ones(1000)
for i in range(1, 100_000):
    comm.allreduce(t, name="grad")
    if comm.rank == victim and i == at:
        with open(ready, "w") as f:
            json.dump({{"time": time.time(), "seq": i, "sm": os.environ.get("OMPI_MCA_btl_vader_backing_directory")}}, f)
        os.kill(os.getpid(), getattr(signal, how))
    time.sleep(0.005)
"""


@pytest.mark.parametrize("engine,how,victim", [("mpi", "SIGKILL", 1), ("torch", "SIGKILL", 0),
                                               ("mpi", "SIGSTOP", 0), ("torch", "SIGSTOP", 1)])
def test_a_killed_or_stopped_rank_ends_the_job_naming_it(engine, how, victim, marker, tmp_path):
    """Victim 0 also covers the rank that serves the side channel."""
    fault = tmp_path / "fault.json"
    done = gpurig("run", "-n", 2, "--engine", engine, "--failure-timeout", TIMEOUT_S, "--", sys.executable, "-c",
                  LOOP.format(marker=marker), victim, how, 40, fault, timeout=120)
    ended = time.time()
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and fault.exists(), done.stderr[-3000:]
    assert ended - json.loads(fault.read_text())["time"] < ENDS_WITHIN_S, done.stderr[-3000:]
    # the collective: the victim's 40th (SIGKILL: it was killed after it), or the 41st the other waits in
    what = ("was killed by SIGKILL after allreduce #40 (grad, 4.0 KB)" if how == "SIGKILL"
            else "stopped responding during allreduce #41 (grad, 4.0 KB)")
    assert lines[-1].startswith(f"gpurig run: rank {victim} on host {HOST} {what}"), done.stderr[-3000:]
    if how == "SIGSTOP":  # the other rank said so too, and how long it waited
        assert any(line.startswith(f"gpurig: rank {victim} on host {HOST} {what}; no heartbeat for") or
                   line.startswith(f"gpurig: rank {victim} on host {HOST} {what} (it serves") for line in lines)
    assert "Traceback" not in done.stderr
    assert leftovers(marker) == []
    if engine == "mpi":  # Open MPI's shared-memory files were in the job's own directory, gone with the job
        backing = json.loads(fault.read_text())["sm"]
        assert backing and backing.startswith("/dev/shm/gpurig-mpi-") and not os.path.exists(backing)


SLOW = """
import os, sys, time, torch, gpurig
comm = gpurig.init()
for i in range(3):
    comm.allreduce(torch.ones(4), name="step")
    if comm.rank == 1 and i == 1:
        time.sleep(float(sys.argv[1]))  # a long step: computing, not dead
os.write(1, f"finished {comm.rank}\\n".encode())  # one write: ranks share stdout
"""


def test_a_long_step_is_a_stall_not_a_failure():
    done = gpurig("run", "-n", 2, "--engine", "torch", "--failure-timeout", 2, "--stall-timeout", 2, "--",
                  sys.executable, "-c", SLOW, 5, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(done.stdout.split()) == ["0", "1", "finished", "finished"]
    stalls = [line for line in done.stderr.splitlines() if "stall:" in line]
    assert len(stalls) == 1, done.stderr  # once per stall
    assert stalls[0].startswith(f"gpurig: stall: rank 0 has waited 2 s in allreduce #3 (step, 16 B); rank 1 on host "
                                f"{HOST} has not reached it (it is after allreduce #2 (step, 16 B)"), stalls


def test_stall_shutdown_ends_a_job_whose_rank_sleeps_between_collectives(engine="mpi"):
    """A rank stuck in its own code (sleeping here) while the other waits in a collective: reported after
    --stall-timeout, the job ended after --stall-shutdown, naming the rank (MPI here, Gloo in the next test: the
    watch is the same on both)."""
    start = time.time()
    done = gpurig("run", "-n", 2, "--engine", engine, "--stall-timeout", 2, "--stall-shutdown", 4, "--",
                  sys.executable, "-c", SLOW, 3600, timeout=120)
    assert done.returncode != 0 and time.time() - start < 60, done.stderr[-3000:]
    said = " ".join(done.stderr.split())
    assert f"rank 1 on host {HOST} has not reached it" in said and "ended after 4 s (--stall-shutdown)" in said, \
        said[-3000:]


def test_failure_detection_can_be_turned_off():
    env = {"GPURIG_FAILURE_TIMEOUT": "0", "GPURIG_STALL_TIMEOUT": "0"}
    done = gpurig("run", "-n", 2, "--engine", "torch", "--", sys.executable, "-c",
                  "import gpurig, threading; gpurig.init(); print(sorted(t.name for t in threading.enumerate()))",
                  timeout=60, env=env)
    assert done.returncode == 0 and "gpurig-watch" not in done.stdout, done.stdout + done.stderr


RAISES = """
import sys, torch, gpurig
comm = gpurig.init()
for i in range(3):
    comm.allreduce(torch.ones(4), name="step")
if comm.rank == 1:
    raise ValueError("a bug in step 4")
comm.allreduce(torch.ones(4), name="step")
"""


@pytest.mark.parametrize("how,said_how", [("raise ValueError('a bug in step 4')", "raised ValueError: a bug in step 4"),
                                          ("sys.exit(3)", "exited with code 3")])
def test_a_rank_that_raises_is_named_with_its_exception_not_as_finished(tmp_path, how, said_how, engine="torch"):
    """Rank 1 raises (or exits with a code) between collectives while rank 0 waits in the next one: rank 0's watch
    says what rank 1 did (the launcher's last line names the rank); it did not "finish its program"."""
    script = tmp_path / "raises.py"
    script.write_text(RAISES.replace("raise ValueError(\"a bug in step 4\")", how))
    done = gpurig("run", "-n", 2, "--engine", engine, "--failure-timeout", TIMEOUT_S, "--", sys.executable, script,
                  timeout=120)
    assert done.returncode != 0
    said = " ".join(done.stderr.split())
    assert f"rank 1 on host {HOST} {said_how} after collective #3" in said, said[-3000:]
    assert "finished its program" not in said
    # the launcher's last line: what it raised, and after which collective (as for a rank killed in one)
    assert done.stderr.strip().splitlines()[-1] == (f"gpurig run: rank 1 on host {HOST} {said_how} "
                                                    f"after allreduce #3 (step, 16 B); stopped the other 1 rank")


DDP_HOOKED = """
import os, signal, sys, torch, torch.distributed as dist  # {marker}
import gpurig
dist.init_process_group("gloo")                  # the script's own group, as a torchrun script makes it
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64))
model.register_comm_hook(gpurig.hooks.State(), gpurig.hooks.fp16)
for step in range(1, 1000):
    if dist.get_rank() == 1 and step == 5:
        os.kill(os.getpid(), signal.SIGSTOP)
    model(torch.randn(8, 64)).sum().backward()
"""


def test_a_ddp_script_with_gpurigs_hooks_is_watched_on_its_own_group(marker):
    """A torchrun-style DDP script that made its process group itself, with gpurig's compression hooks: the watch
    shares the group's TCPStore (it used to say "found no address for the side channel" and watch nothing)."""
    done = gpurig("run", "-n", 2, "--engine", "torch", "--failure-timeout", TIMEOUT_S, "--", sys.executable, "-c",
                  DDP_HOOKED.format(marker=marker), timeout=120)
    assert done.returncode != 0 and "failure detection is off" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1].startswith(f"gpurig run: rank 1 on host {HOST} stopped responding"), \
        done.stderr[-3000:]
    assert leftovers(marker) == []
