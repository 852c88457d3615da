"""``gpurig run`` end to end: real ranks over mpirun and the local torch spawn; a failure stops every rank.

Every launch has a timeout: a misconfigured MPI launch hangs instead of failing. Ranks share one stdout,
and with PYTHONUNBUFFERED print() writes piece by piece, so a rank here writes each line with one os.write.
"""

import json
import os
import pty
import re
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpurig.launch.rank_env import HOST_ALLOCATOR
from gpurig.train.checkpoints import saved_epochs
from conftest import leftovers

HOST = socket.gethostname()
GPURIG = [sys.executable, "-m", "gpurig"]


def gpurig_run(*args, timeout=60, env=None, unset=()) -> subprocess.CompletedProcess:
    full_env = {name: value for name, value in {**os.environ, **(env or {})}.items() if name not in unset}
    return subprocess.run([*GPURIG, "run", *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env=full_env)


def rank_script(marker: str, ready_dir, then: str = "", barrier: bool = False) -> str:
    """A rank that says it is ready (a file per rank), does ``then``, and sleeps; ``marker`` names its processes."""
    return "\n".join([
        f"import os, signal, sys, time  # {marker}",
        "rank = int(os.environ.get('RANK') or os.environ['OMPI_COMM_WORLD_RANK'])",
        "if os.environ['GPURIG_ENGINE'] == 'mpi' and " + str(barrier) + ":",
        "    from mpi4py import MPI; MPI.COMM_WORLD.Barrier()",
        f"open(os.path.join({str(ready_dir)!r}, f'ready-{{rank}}'), 'w').close()",
        then,
        "if os.environ['GPURIG_ENGINE'] == 'mpi' and " + str(barrier) + ":",
        "    MPI.COMM_WORLD.Barrier()",
        "time.sleep(600)",
    ])


# How long a job may take to start its ranks, or to end once told to: generous, since another suite or a benchmark
# can load this machine's 2 cores (each returns as soon as it happens; only a hang waits it out).
START_S = END_S = 120


def interruptible() -> None:
    """In a child before it runs: Ctrl-C as a terminal would have it. A suite started in the background by a
    shell without job control (``make test &`` in a script) inherits SIGINT ignored, and a Python started so
    never turns it into KeyboardInterrupt (the launcher would run on through every Ctrl-C test)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_job(engine: str, nprocs: int, marker: str, ready_dir) -> subprocess.Popen:
    """Start ``gpurig run`` of sleeping ranks and return once every rank is running."""
    job = subprocess.Popen([*GPURIG, "run", "-n", str(nprocs), "--engine", engine, "--", "python", "-c",
                            rank_script(marker, ready_dir)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           preexec_fn=interruptible)
    deadline = time.monotonic() + START_S
    while len(list(ready_dir.glob("ready-*"))) < nprocs:
        assert job.poll() is None and time.monotonic() < deadline, job.communicate()
        time.sleep(0.05)
    return job


@pytest.mark.parametrize("engine", ["mpi", "torch"])
def test_two_ranks_get_their_rank_size_and_engine(engine):
    names = ["GPURIG_ENGINE", "OMP_NUM_THREADS", "GPURIG_RUN_STATUS_DIR", "RANK", "WORLD_SIZE", "LOCAL_RANK",
             "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
             *HOST_ALLOCATOR]
    script = f"import json, os; os.write(1, (json.dumps({{k: os.environ.get(k) for k in {names}}}) + '\\n').encode())"
    done = gpurig_run("-n", 2, "--engine", engine, "--", "python", "-c", script,
                      unset=["OMP_NUM_THREADS", *HOST_ALLOCATOR])
    assert done.returncode == 0, done.stderr
    envs = [json.loads(line) for line in done.stdout.splitlines()]
    threads = str(max(1, os.cpu_count() // 2))
    assert all(e["GPURIG_ENGINE"] == engine and e["OMP_NUM_THREADS"] == threads for e in envs)
    assert all(e[name] == value for e in envs for name, value in HOST_ALLOCATOR.items())
    assert len({e["GPURIG_RUN_STATUS_DIR"] for e in envs}) == 1
    assert not os.path.exists(envs[0]["GPURIG_RUN_STATUS_DIR"])  # removed when the job ends
    if engine == "mpi":
        assert sorted((e["OMPI_COMM_WORLD_RANK"], e["OMPI_COMM_WORLD_SIZE"]) for e in envs) == [("0", "2"), ("1", "2")]
    else:
        assert sorted((e["RANK"], e["WORLD_SIZE"], e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"]) for e in envs) == [
            ("0", "2", "0", "2"), ("1", "2", "1", "2")]
        assert {e["MASTER_ADDR"] for e in envs} == {"127.0.0.1"} and len({e["MASTER_PORT"] for e in envs}) == 1


@pytest.mark.parametrize("name", ["OMP_NUM_THREADS", "MALLOC_TRIM_THRESHOLD_"])
def test_a_users_own_setting_is_kept(name):
    done = gpurig_run("-n", 2, "--engine", "torch", "--", "python", "-c",
                      f"import os; os.write(1, os.environ['{name}'].encode() + b'\\n')", env={name: "3"})
    assert done.returncode == 0 and done.stdout.split() == ["3", "3"]


@pytest.mark.parametrize("engine", ["mpi", "torch"])
def test_a_failing_rank_is_named_and_its_code_returned(engine, marker, tmp_path):
    """Under MPI the ranks are in a barrier: without an abort, rank 1 would hang in MPI_Finalize for ever."""
    script = rank_script(marker, tmp_path, then="if rank == 1: sys.exit(3)", barrier=True)
    start = time.monotonic()
    done = gpurig_run("-n", 3, "--engine", engine, "--", "python", "-c", script)
    assert time.monotonic() - start < 30
    assert done.returncode == 3, done.stderr
    assert done.stderr.splitlines()[-1] == f"gpurig run: rank 1 on host {HOST} exited with code 3; stopped the other 2 ranks"
    assert done.stderr.count("gpurig run:") == 1
    assert "MPI_ABORT" not in done.stderr and "prterun" not in done.stderr  # Open MPI's reports: read, not shown
    assert leftovers(marker) == []


@pytest.mark.parametrize("engine", ["mpi", "torch"])
def test_a_rank_killed_by_sigkill_stops_the_job_within_30_s(engine, marker, tmp_path):
    script = rank_script(marker, tmp_path, then="if rank == 2: time.sleep(1); os.kill(os.getpid(), signal.SIGKILL)")
    start = time.monotonic()
    done = gpurig_run("-n", 3, "--engine", engine, "--", "python", "-c", script)
    assert time.monotonic() - start < 30
    assert done.returncode == 137, done.stderr
    assert done.stderr.splitlines()[-1] == f"gpurig run: rank 2 on host {HOST} was killed by SIGKILL; stopped the other 2 ranks"
    assert leftovers(marker) == []


@pytest.mark.parametrize("engine", ["mpi", "torch"])
def test_a_killed_rank_wrapper_stops_the_job(engine, marker, tmp_path):
    """No status file then (the wrapper is gone): the rank is named from what mpirun or the spawn saw."""
    job = start_job(engine, 2, marker, tmp_path)
    wrapper = next(p for p in leftovers(marker, wait=0) if "gpurig.launch.rank_wrapper" in " ".join(p.cmdline())
                   and (p.environ().get("RANK") or p.environ().get("OMPI_COMM_WORLD_RANK")) == "1")
    wrapper.kill()
    _, err = job.communicate(timeout=END_S)
    assert job.returncode == 137, err
    assert err.splitlines()[-1] == f"gpurig run: rank 1 on host {HOST} was killed by SIGKILL; stopped the other 1 rank"
    assert leftovers(marker) == []


@pytest.mark.parametrize("engine", ["mpi", "torch"])
def test_ctrl_c_stops_every_rank(engine, marker, tmp_path):
    job = start_job(engine, 2, marker, tmp_path)
    job.send_signal(signal.SIGINT)
    _, err = job.communicate(timeout=END_S)
    assert job.returncode == 130 and err.splitlines()[-1] == "gpurig: interrupted"
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err   # one line, not one trace per rank
    assert leftovers(marker) == []


def test_sigterm_stops_every_rank_and_is_named(marker, tmp_path):
    """A scheduler's SIGTERM (or kill) is not a Ctrl-C: the job ends the same way, and says which, with 128 + 15 as
    a shell reports a process SIGTERM ended (one engine: the launcher's handling is the same for both)."""
    job = start_job("torch", 2, marker, tmp_path)
    job.send_signal(signal.SIGTERM)
    _, err = job.communicate(timeout=END_S)
    assert job.returncode == 143 and err.splitlines()[-1] == "gpurig: stopped by SIGTERM", err
    assert leftovers(marker) == []


def test_ctrl_c_stops_gpurig_train_without_a_traceback(tmp_path):
    """Ctrl-C reaches every rank of ``gpurig train`` at once (the terminal signals the whole group): each rank
    ends quietly, the finished epochs stay, and the one line is the launcher's."""
    example = Path(__file__).parent.parent / "examples" / "own_model"   # epochs of a fraction of a second
    job = subprocess.Popen([*GPURIG, "train", "--model", "digits:build", "--data", "digits:load", "--engine", "torch",
                            "-n", "2", "--epochs", "1000", "--no-predict", "--compression", "none", "--checkpoint-dir",
                            str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=example,
                           preexec_fn=lambda: (interruptible(), os.setpgrp()))
    deadline = time.monotonic() + START_S
    while max(saved_epochs(tmp_path), default=0) < 2:   # epoch 1's line was printed by then (older files rotate out)
        assert job.poll() is None and time.monotonic() < deadline, job.communicate()
        time.sleep(0.1)
    os.killpg(job.pid, signal.SIGINT)
    out, err = job.communicate(timeout=END_S)
    assert job.returncode == 130 and err.splitlines()[-1] == "gpurig: interrupted", err
    assert "Traceback" not in out + err and "finished its program" not in out + err, err
    assert max(saved_epochs(tmp_path), default=0) >= 2, (saved_epochs(tmp_path), err)   # the last finished epochs stay (the oldest rotated out, as --keep says)
    # into a pipe or a log, an epoch is one line, however long: grep finds its numbers
    lines = [line for line in out.splitlines() if line.startswith("epoch 1/1000")]
    assert len(lines) == 1, out + err
    [line] = lines
    assert "samples/s" in line and line.endswith("TFLOP/s"), out


@pytest.mark.skipif(not hasattr(os, "login_tty"), reason="os.login_tty needs Python 3.11")
@pytest.mark.parametrize("engine", ["mpi", "torch"])
def test_ctrl_c_at_a_terminal_reaches_each_rank_once(engine, marker, tmp_path):
    """Typed at a terminal, Ctrl-C reaches the whole foreground group: no rank may get it twice (torch: it
    interrupts the rank's own clean-up), and mpirun must not get a second signal (it then forces its way out)."""
    cleanup = "except KeyboardInterrupt:\n    time.sleep(1); os.write(1, f'rank {rank} cleaned up\\n'.encode()); sys.exit(1)"
    started, ready = tmp_path / "started", f"open(os.path.join({str(tmp_path)!r}, f'ready-{{rank}}'), 'w').close()"
    started.mkdir()  # the ready file is written inside the try: a Ctrl-C after it reaches the rank's handler
    script = rank_script(marker, started).replace("time.sleep(600)",
                                                  f"try:\n    {ready}\n    time.sleep(600)\n{cleanup}")
    terminal, their_end = pty.openpty()
    job = subprocess.Popen([*GPURIG, "run", "-n", "2", "--engine", engine, "--", "python", "-c", script],
                           preexec_fn=lambda: (interruptible(), os.login_tty(their_end)), pass_fds=(their_end,))
    os.close(their_end)
    try:
        deadline = time.monotonic() + START_S
        while len(list(tmp_path.glob("ready-*"))) < 2:  # Ctrl-C only once both ranks wait for it in their try
            assert job.poll() is None and time.monotonic() < deadline, "the ranks did not start"
            time.sleep(0.05)
        os.write(terminal, b"\x03")
        assert job.wait(timeout=END_S) == 130
        shown = b""
        while select.select([terminal], [], [], 0.2)[0]:
            try:
                shown += os.read(terminal, 65536)
            except OSError:  # every process holding the terminal has ended
                break
    finally:
        os.close(terminal)
    shown = shown.decode()
    assert "gpurig: interrupted" in shown and "Abort is in progress" not in shown
    if engine == "torch":
        assert "rank 0 cleaned up" in shown and "rank 1 cleaned up" in shown
    assert leftovers(marker) == []


@pytest.mark.parametrize("engine", ["mpi", "torch"])
def test_no_rank_outlives_a_killed_launcher(engine, marker, tmp_path):
    job = start_job(engine, 2, marker, tmp_path)
    job.kill()
    job.communicate(timeout=END_S)
    assert leftovers(marker) == []


@pytest.mark.parametrize("args,message", [
    (["-n", "0", "--", "python", "-c", "1"], "gpurig: error: -n must be at least 1, got 0"),
    (["-n", "-2", "--", "python", "-c", "1"], "gpurig: error: -n must be at least 1, got -2"),
    (["-n", "two", "--", "true"], "gpurig: error: argument -n/-np/--nprocs: invalid int value: 'two'"),
    (["-n", "2"], "gpurig: error: no command to run"),
    (["-n", "2", "--"], "gpurig: error: no command to run"),
    (["--hosts", "a:x", "--", "true"], "gpurig: error: --hosts: 'a:x' is not HOST or HOST:SLOTS"),
    (["--hosts", "a:4,,b", "--", "true"], "gpurig: error: --hosts: '' is not HOST or HOST:SLOTS"),
    (["-n", "9", "--hosts", "a:4,b:4", "--", "true"], "gpurig: error: -n 9 needs 9 slots but --hosts a:4,b:4 has 8"),
    (["--engine", "nccl", "--", "true"], "gpurig: error: argument --engine: invalid choice: 'nccl'"),
    (["--engine", "torch", "--hosts", "a:2,b:2", "--", "true"],
     "gpurig: error: multi-host runs with --engine torch need SLURM (srun gpurig run --engine torch -- ...) or --engine mpi"),
    (["-n", "2", "--", "no-such-program-anywhere"], "gpurig: error: command not found: no-such-program-anywhere"),
    (["-n", "2", "--", "python", "-u", "no-such-script.py"],
     "gpurig: error: python: can't open file 'no-such-script.py': no such file (from "),
    (["-n", "2", "--", __file__], f"gpurig: error: {__file__}: not executable (chmod +x {__file__}, or run it with "
                                  "its interpreter)"),
    (["-n", "2", "--mpi-args", "--mca 'x", "--", "true"], "gpurig: error: --mpi-args \"--mca 'x\": No closing quotation"),
    (["-n", "2", "--engine", "torch", "--mpi-args", "--mca btl self", "--", "true"],
     "gpurig: error: --mpi-args is for --engine mpi"),
    (["-n", "3", "--nproc-per-node", "2", "--", "true"], "gpurig: error: -n 3 disagrees with --nproc-per-node 2"),
    (["--nproc-per-node", "0", "--", "true"], "gpurig: error: --nproc-per-node must be at least 1, got 0"),
    (["--engine", "torch", "--nnodes", "2", "--", "true"], "gpurig: error: --nnodes 2 needs --master-addr"),
    (["--engine", "torch", "--nnodes", "2", "--node-rank", "2", "--master-addr", "a", "--", "true"],
     "gpurig: error: --node-rank 2 with --nnodes 2: node ranks go from 0 to 1"),
    (["--nnodes", "2", "--node-rank", "1", "--", "true"], "gpurig: error: --nnodes 2 --node-rank 1: under --engine mpi"),
    (["--master-port", "70000", "--", "true"], "gpurig: error: --master-port must be a TCP port from 1 to 65535"),
    (["--hostfile", "/nonexistent/hosts", "--", "true"], "gpurig: error: --hostfile /nonexistent/hosts: cannot read it"),
    (["-H", "a:2", "--hostfile", "/etc/hostname", "--", "true"], "gpurig: error: --hosts (-H) and --hostfile both"),
    (["--max-restarts", "-1", "--", "true"], "gpurig: error: --max-restarts must be 0 or more, got -1"),
    (["-n", "2", "-H", "localhost:1,no-such-host.invalid:1", "--", "true"],
     "gpurig: error: --hosts: cannot resolve 'no-such-host.invalid'"),
    (["--log-dir", "/dev/null/logs", "--", "true"], "gpurig: error: --log-dir /dev/null/logs: cannot create it"),
])
def test_bad_input_is_one_line_and_exit_2(args, message):
    done = gpurig_run(*args, timeout=30)
    assert done.returncode == 2
    assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith(message), done.stderr
    assert done.stdout == ""


def test_version_and_help():
    version = subprocess.run([*GPURIG, "--version"], capture_output=True, text=True, timeout=30)
    assert version.returncode == 0 and version.stdout.startswith("gpurig ")
    helped = subprocess.run([*GPURIG, "run", "--help"], capture_output=True, text=True, timeout=30)
    assert helped.returncode == 0 and "gpurig run -n 4 -- python train.py" in helped.stdout


@pytest.mark.parametrize("verb", ["", "train", "run", "emulate", "plan", "doctor", "bench", "predict", "choose"])
def test_every_help_fits_80_columns(verb):
    """The description and examples wrap to the terminal (a QA sweep found 412-character lines), and long lists of
    choices are written out in the help, not in the usage line."""
    helped = subprocess.run([*GPURIG, *filter(None, [verb]), "--help"], capture_output=True, text=True, timeout=30,
                            env={**os.environ, "COLUMNS": "80"})
    assert helped.returncode == 0 and "examples:" in helped.stdout
    assert [line for line in helped.stdout.splitlines() if len(line) > 80] == []


def test_srun_tasks_become_torch_ranks_that_meet():
    """What ``srun -n 2 gpurig run --engine torch -- ...`` does: one launcher per task, SLURM's variables each."""
    script = ("import os, torch, torch.distributed as dist; dist.init_process_group('gloo'); t = torch.ones(1); "
              "dist.all_reduce(t); print(os.environ['RANK'], os.environ['LOCAL_WORLD_SIZE'], int(t.item())); "
              # without it, Gloo's threads may free tensors while Python finalizes, and abort (a torch issue)
              "dist.destroy_process_group()")
    step = {**os.environ, "SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_ID": "0",
            "SLURM_JOB_NODELIST": "localhost", "SLURM_TASKS_PER_NODE": "2", "SLURM_JOB_ID": str(os.getpid())}
    tasks = [subprocess.Popen([*GPURIG, "run", "--engine", "torch", "--", "python", "-c", script],
                              env={**step, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r), "SLURM_NODEID": "0"},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    outputs = [task.communicate(timeout=START_S + END_S) for task in tasks]  # under load it took 150 s
    assert [task.returncode for task in tasks] == [0, 0], outputs
    assert [out.split() for out, _ in outputs] == [["0", "2", "2"], ["1", "2", "2"]]


@pytest.mark.parametrize("engine", ["mpi", "torch"])
def test_an_unmodified_torchrun_script_runs_on_either_engine(engine, tmp_path):
    # RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT under mpirun too
    env = {"CASE_DIR": str(tmp_path)}
    done = subprocess.run([*GPURIG, "run", "-n", "2", "--engine", engine, "--", sys.executable,
                           str(Path(__file__).parent / "workers" / "torchrun_script.py")],
                          capture_output=True, text=True, timeout=120, env={**os.environ, **env})
    assert done.returncode == 0, done.stderr[-2000:]
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [s["rank"] for s in seen] == [0, 1] and all(s["size"] == 2 and s["local_world_size"] == 2 for s in seen)
    assert [s["local_rank"] for s in seen] == [0, 1] and all(s["same_gradient"] for s in seen)


@pytest.mark.parametrize("engine", ["mpi", "torch"])
def test_pytorchs_ddp_tutorial_script_trains_unmodified(engine):
    """benchmarks/ddp_tutorial.py runs it 100 times per engine (docs/reliability.md); here once each."""
    done = gpurig_run("-n", 2, "--engine", engine, "--", "python",
                      Path(__file__).parents[1] / "examples" / "ddp_tutorial.py", timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert all(f"Finished running basic DDP example on rank {r}." in done.stdout for r in (0, 1)), done.stdout


ENV_DUMP = ("import json, os; os.write(1, (json.dumps({k: os.environ.get(k) for k in ['RANK', 'WORLD_SIZE', "
            "'LOCAL_RANK', 'LOCAL_WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT', 'GLOO_SOCKET_IFNAME', "
            "'NCCL_SOCKET_IFNAME']}) + '\\n').encode())")


def ranks_seen(stdout: str) -> list[tuple]:
    envs = [json.loads(line) for line in stdout.splitlines()]
    return sorted((e["RANK"], e["WORLD_SIZE"], e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"]) for e in envs)


@pytest.mark.parametrize("engine,flags", [
    ("torch", ["--nproc-per-node", "2"]),                      # torchrun's
    ("mpi", ["--nproc-per-node", "2"]),
    ("mpi", ["-np", "2", "-H", "localhost:2"]),                # Horovod's
    ("mpi", ["--hostfile", "HOSTFILE"]),
])
def test_torchrun_and_horovod_flags_start_the_same_ranks(engine, flags, tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# Horovod's format\nlocalhost slots=2\n")
    done = gpurig_run(*[str(hostfile) if f == "HOSTFILE" else f for f in flags], "--engine", engine, "--", "python",
                      "-c", ENV_DUMP)
    assert done.returncode == 0, done.stderr
    assert ranks_seen(done.stdout) == [("0", "2", "0", "2"), ("1", "2", "1", "2")]


def test_two_torch_nodes_meet_as_torchrun_nodes_do(tmp_path):
    """``--nnodes 2 --node-rank K`` on each of two "machines" (two launchers here): one job of 4 ranks."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    script = ("import os, torch, torch.distributed as dist; dist.init_process_group('gloo'); t = torch.ones(1); "
              "dist.all_reduce(t); os.write(1, f\"{os.environ['RANK']} {os.environ['LOCAL_RANK']} {int(t.item())}\\n\""
              ".encode()); dist.destroy_process_group()")
    nodes = [subprocess.Popen([*GPURIG, "run", "--engine", "torch", "--nnodes", "2", "--node-rank", str(k),
                               "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", port, "--",
                               "python", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for k in (0, 1)]
    outputs = [node.communicate(timeout=120) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs
    assert [sorted(out.splitlines()) for out, _ in outputs] == [["0 0 4", "1 1 4"], ["2 0 4", "3 1 4"]]


@pytest.mark.parametrize("engine,named", [("torch", "flag"), ("mpi", "flag"), ("torch", "variable")])
def test_iface_names_the_interface_to_gloo_and_nccl(engine, named, monkeypatch):
    """``--iface`` or GPURIG_IFACE. Loopback under MPI keeps to shared memory: Open MPI's runtime refuses
    loopback as its only out-of-band interface."""
    if named == "variable":
        monkeypatch.setenv("GPURIG_IFACE", "lo")
    done = gpurig_run("-n", 2, "--engine", engine, *(["--iface", "lo"] if named == "flag" else []), "--", "python",
                      "-c", ENV_DUMP)
    assert done.returncode == 0, done.stderr
    envs = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(e["GLOO_SOCKET_IFNAME"], e["NCCL_SOCKET_IFNAME"], e["MASTER_ADDR"]) for e in envs] == [("lo", "lo", "127.0.0.1")] * 2


@pytest.mark.parametrize("variable,value,said", [
    ("GPURIG_IFACE", "no-such-iface0", "GPURIG_IFACE 'no-such-iface0': no such network interface here"),
    ("GPURIG_COMM_TIMEOUT", "0", "GPURIG_COMM_TIMEOUT must be a number of seconds above 0"),
    ("GPURIG_COMM_TIMEOUT", "soon", "GPURIG_COMM_TIMEOUT must be a number of seconds above 0")])
def test_a_bad_variable_is_refused_once_by_the_launcher(variable, value, said, monkeypatch):
    monkeypatch.setenv(variable, value)
    done = gpurig_run("-n", 2, "--engine", "torch", "--", "python", "-c", "print('ran')")
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"gpurig: error: {said}"), done.stderr


def test_unbuffered_ranks_lines_stay_whole(tmp_path):
    """PYTHONUNBUFFERED (set in many containers) makes print write its text and its newline apart; two torch ranks
    sharing the launcher's stdout then spliced lines ("rank 0 …rank 1 …", 8 in 40,000 here). Each rank's Python
    streams are line-buffered instead: one write a line."""
    script = ("import os, sys; r = os.environ['RANK']; print(sys.stdout.line_buffering, sys.stderr.line_buffering)\n"
              "for i in range(20000): print(f'rank {r} line {i:05d} ' + 'x' * 60)")
    done = gpurig_run("-n", 2, "--engine", "torch", "--", "python", "-c", script, env={"PYTHONUNBUFFERED": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines.count("True True") == 2 and len(lines) == 40002
    spliced = [line for line in lines if line != "True True" and not re.fullmatch(r"rank [01] line \d{5} x{60}", line)]
    assert spliced == []


@pytest.mark.parametrize("engine", ["mpi", "torch"])
def test_each_ranks_lines_are_tagged_and_logged(engine, tmp_path):
    script = ("import os, sys; r = os.environ['RANK']; print(f'out {r}'); print(f'err {r}', file=sys.stderr); "
              "sys.stdout.write(f'unfinished {r}')")
    done = gpurig_run("-n", 2, "--engine", engine, "--tag-output", "--log-dir", tmp_path, "--", "python", "-c", script)
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == ["[rank0]: out 0", "[rank0]: unfinished 0", "[rank1]: out 1",
                                                "[rank1]: unfinished 1"]
    assert sorted(line for line in done.stderr.splitlines() if "err" in line) == ["[rank0]: err 0", "[rank1]: err 1"]
    for rank in (0, 1):  # the log as the rank wrote it, both streams
        assert sorted((tmp_path / f"rank-{rank}.log").read_text().splitlines()) == sorted(
            [f"out {rank}", f"err {rank}", f"unfinished {rank}"])
    # one write per line: untagged, the ranks share the launcher's stdout as under mpirun or torchrun, and an
    # unbuffered print's text and newline (two writes) can interleave with the other rank's ('plainplain')
    untagged = gpurig_run("-n", 2, "--engine", engine, "--", "python", "-c", "import sys; sys.stdout.write('plain\\n')")
    assert untagged.stdout.splitlines() == ["plain", "plain"]  # not a terminal: no tags unless asked


FAIL_FIRST_TIME = """
import os, sys, time
rank, count = os.environ["RANK"], os.environ["GPURIG_RESTART_COUNT"]
os.write(1, f"{rank} {count} {os.environ['TORCHELASTIC_RESTART_COUNT']}\\n".encode())
if rank == "1" and int(count) < FAILURES:
    time.sleep(2)  # mpirun drops a line still on its way when the job ends
    sys.exit(4)
"""


@pytest.mark.parametrize("engine", ["mpi", "torch"])
def test_a_failed_job_starts_again_up_to_max_restarts(engine, marker):
    """Each attempt's ranks run once (the standby ranks of the next attempt wait until they are needed), and the
    standby of an attempt never needed is gone when the job ends."""
    ok = gpurig_run("-n", 2, "--engine", engine, "--max-restarts", 2, "--", "python", "-c",
                    FAIL_FIRST_TIME.replace("FAILURES", "1") + f"# {marker}", timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert sorted(ok.stdout.split("\n")[:-1]) == ["0 0 0", "0 1 1", "1 0 0", "1 1 1"]
    assert leftovers(marker) == []
    assert f"gpurig run: rank 1 on host {HOST} exited with code 4; stopped the other 1 rank" in ok.stderr
    assert ok.stderr.splitlines()[-1] == "gpurig run: restart 1 of 2: starting the 2 ranks again"
    given_up = gpurig_run("-n", 2, "--engine", engine, "--max-restarts", 1, "--", "python", "-c",
                          FAIL_FIRST_TIME.replace("FAILURES", "9"), timeout=120)
    assert given_up.returncode == 4
    assert given_up.stderr.count("restart 1 of 1") == 1 and "restart 2" not in given_up.stderr
    assert given_up.stderr.splitlines()[-1].startswith("gpurig run: rank 1 on host")


def test_a_train_rank_of_another_launcher_refuses_max_restarts():
    """Restarting is the launcher's: a rank that torchrun or mpirun started cannot act on the flag."""
    done = subprocess.run([*GPURIG, "train", "--max-restarts", "1", "--no-predict"], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                                           "MASTER_PORT": "29500"})   # as torchrun starts a rank
    assert done.returncode == 2 and done.stderr.splitlines() == [
        "gpurig: error: --max-restarts: this rank was started by another launcher, which restarts the job or not "
        "(gpurig run --max-restarts, torchrun --max-restarts)"]


def test_train_as_a_rank_refuses_a_count_its_launcher_did_not_start():
    """`gpurig emulate --nodes 2 -- gpurig train -n 4` trained on 2 ranks and said nothing of the 4."""
    done = gpurig_run("-n", 2, "--", *GPURIG, "train", "-n", 3, "--epochs", 1, "--no-predict", timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "-n 3: this rank's launcher started 2 ranks" in done.stderr and "Traceback" not in done.stderr
