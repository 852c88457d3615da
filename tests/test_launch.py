"""``gpurig run``: real processes over mpirun and the local torch spawn; failures stop every rank."""

import json
import os
import subprocess
import sys
import time

import psutil
import pytest

from conftest import gpurig
from gpurig.errors import UsageError
from gpurig.launch import default_nprocs, expand_hostlist, parse_hosts, run_job
from gpurig.launch.job import abort_on_failure

PRINT_ENV = ("import os, json; print(json.dumps({k: os.environ.get(k) for k in "
             "['GPURIG_ENGINE', 'OMP_NUM_THREADS', 'RANK', 'WORLD_SIZE', 'OMPI_COMM_WORLD_RANK']}))")


def test_two_ranks_get_rank_and_engine(engine):
    done = gpurig("run", "-n", 2, "--engine", engine, "--", sys.executable, "-c", PRINT_ENV, timeout=60)
    assert done.returncode == 0, done.stderr
    envs = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(envs) == 2 and all(e["GPURIG_ENGINE"] == engine and e["OMP_NUM_THREADS"] == "1" for e in envs)
    ranks = sorted(int(e["RANK"] if engine == "torch" else e["OMPI_COMM_WORLD_RANK"]) for e in envs)
    assert ranks == [0, 1]


def test_a_failing_rank_is_named_and_its_code_returned(engine):
    script = ("import gpurig, sys, time; c = gpurig.init(); c.barrier(); time.sleep(0.3 * c.rank)\n"
              "if c.rank == 1: sys.exit(3)\nc.barrier(); time.sleep(600)")
    start = time.monotonic()
    done = gpurig("run", "-n", 3, "--engine", engine, "--", sys.executable, "-c", script, timeout=90)
    assert done.returncode == 3
    assert time.monotonic() - start < 30
    assert "gpurig run: rank 1 on" in done.stderr and "exited with code 3" in done.stderr.splitlines()[-1]


def _leftover(marker: str) -> list:
    return [p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]


def test_a_killed_rank_stops_the_job_within_30_s(engine):
    marker = f"sleep_after_kill_{engine}"
    script = (f"import gpurig, os, signal, time; c = gpurig.init(); c.barrier(); time.sleep(1)  # {marker}\n"
              "if c.rank == 2: os.kill(os.getpid(), signal.SIGKILL)\nc.barrier(); time.sleep(600)")
    start = time.monotonic()
    done = gpurig("run", "-n", 3, "--engine", engine, "--", sys.executable, "-c", script, timeout=90)
    elapsed = time.monotonic() - start
    assert done.returncode == 137, done.stderr
    assert elapsed < 30
    assert "rank 2 on" in done.stderr.splitlines()[-1] and "SIGKILL" in done.stderr.splitlines()[-1]
    time.sleep(0.5)
    assert _leftover(marker) == []


def test_success_returns_zero_and_runs_every_rank():
    assert run_job([sys.executable, "-c", "import gpurig; gpurig.init().barrier()"], 2, engine="mpi") == 0


@pytest.mark.parametrize("args,message", [
    (["run", "-n", "0", "--", "python", "-c", "1"], "-n must be at least 1"),
    (["run", "-n", "2"], "no command to run"),
    (["run", "--hosts", "a:x", "--", "true"], "not HOST or HOST:SLOTS"),
    (["run", "-n", "9", "--hosts", "a:4,b:4", "--", "true"], "needs 9 slots"),
    (["run", "--engine", "nccl-over-carrier-pigeon", "--", "true"], "unknown engine"),
    (["run", "--engine", "torch", "--hosts", "a:2,b:2", "--", "true"], "need SLURM"),
])
def test_bad_input_is_one_line_and_exit_2(args, message):
    done = gpurig(*args, timeout=30)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in done.stderr


def test_host_parsing():
    assert parse_hosts("a:4,b:4") == [("a", 4), ("b", 4)]
    assert default_nprocs("a:4,b:2") == 6
    for bad in ("a:0", "a:-1", ",", "a,a", "a b:2"):
        with pytest.raises(UsageError):
            parse_hosts(bad)


@pytest.mark.parametrize("text,hosts", [
    ("node[01-03,07],gpu5", ["node01", "node02", "node03", "node07", "gpu5"]),
    ("a1,b[8-10]", ["a1", "b8", "b9", "b10"]),
    ("single", ["single"]),
])
def test_slurm_hostlist_expansion(text, hosts):
    assert expand_hostlist(text) == hosts


def test_python_scripts_abort_the_mpi_job_when_they_fail():
    assert abort_on_failure([sys.executable, "-m", "pkg"])[1:4] == ["-m", "mpi4py", "-m"]
    assert abort_on_failure(["python3", "-u", "x.py"]) == ["python3", "-u", "x.py"]  # interpreter flags: untouched


def test_slurm_tasks_become_torch_ranks_that_meet():
    """What srun does: start one gpurig run per task, with SLURM's variables; they must form one job."""
    script = "import gpurig, torch; c = gpurig.init(); print(c.rank, c.size, c.allreduce(torch.ones(1), op='sum').item())"
    base = {**os.environ, "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "localhost", "SLURM_TASKS_PER_NODE": "2",
            "SLURM_JOB_ID": str(os.getpid())}
    tasks = [subprocess.Popen([sys.executable, "-m", "gpurig", "run", "--engine", "torch", "--", sys.executable,
                               "-c", script], env={**base, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    outputs = [t.communicate(timeout=60)[0].split() for t in tasks]
    assert [t.returncode for t in tasks] == [0, 0]
    assert outputs == [["0", "2", "2.0"], ["1", "2", "2.0"]]
