"""Several "nodes" on one machine: network namespaces joined by rate-limited veth links.

The source's central problem — between machines the network, not the GPU, is
the bottleneck — is measured here, not assumed: each node is a Linux network
namespace with its own hostname, nodes are joined by veth pairs (two nodes) or
through a bridge in a hub namespace (three or more), and every link is limited
with ``tc tbf`` to a chosen rate (real TCP through a real limit; this kernel has
no netem, so no added latency). Ranks start inside the namespaces:

- MPI: ``gpurig run`` runs inside the first node, mpirun reaching the others
  through an rsh agent that enters their namespace (``python -m
  gpurig.launch.emulator agent``), over TCP on the emulated subnet only;
- torch.distributed: ranks spawned and watched here (as ``gpurig run`` does),
  each entering its node; rendezvous at the first node, Gloo bound to the
  emulated interface.

With ``max_restarts`` a failed job is started again, as ``gpurig run --max-restarts``
does it (MPI: ``gpurig run`` itself, leaving out nodes that are gone).

Everything is removed again on exit, also after a failure or Ctrl-C.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from gpurig.errors import Terminated, UsageError
from gpurig.launch.iface import IFACE_VARIABLE
from gpurig.launch.rank_env import host_defaults

IFACE = "eth1"  # the same name in every node, so one GLOO_SOCKET_IFNAME serves all
MAP_VARIABLE = "GPURIG_EMULATOR_NODES"
# A file of node addresses, one a line, that are "gone": the rsh agent refuses them as ssh refuses a dead machine.
DOWN_VARIABLE = "GPURIG_EMULATOR_DOWN"
# tc's burst is a 32-bit count of bytes, and tbf() asks 10 ms of traffic: 1000 Gbit/s is 1.25 GB of it
MOST_BITS = 1000 * 10**9
STOP_S = 20.0   # how long the job's own launcher has to stop its ranks after SIGTERM, before it is killed


def parse_rate(text: str) -> int:
    """A tc-style rate in bits per second: ``1gbit``, ``10gbit``, ``100mbit``.

    >>> parse_rate("1gbit"), parse_rate("100mbit")
    (1000000000, 100000000)
    >>> parse_rate("0bit")
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: --rate '0bit': want at least 1kbit
    >>> parse_rate("5000gbit")
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: --rate '5000gbit': want at most 1000gbit (beyond it tc's token bucket cannot hold 10 ms of traffic; a faster link is no limit for one machine's memory)
    """
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmg]?)bit", text.strip().lower())
    if not match:
        raise UsageError(f"--rate {text!r}: use a tc rate such as 1gbit, 10gbit or 100mbit")
    bits = int(float(match.group(1)) * {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}[match.group(2)])
    if bits < 10**3:   # tc's token bucket needs a rate; below a kbit/s no collective would finish
        raise UsageError(f"--rate {text!r}: want at least 1kbit")
    if bits > MOST_BITS:
        raise UsageError(f"--rate {text!r}: want at most {MOST_BITS // 10**9}gbit (beyond it tc's token bucket "
                         "cannot hold 10 ms of traffic; a faster link is no limit for one machine's memory)")
    return bits


def tbf(rate: str) -> list[str]:
    """tc's arguments for the token bucket that limits a link to ``rate``.

    >>> tbf("1gbit")
    ['tbf', 'rate', '1000000000', 'burst', '1250000', 'latency', '500ms', 'peakrate', '1010000000', 'mtu', '131072']
    """
    bits = parse_rate(rate)
    burst = max(256 * 1024, bits // 8 // 100)  # at least 10 ms of traffic, or tbf cannot reach the rate
    # A queue of 500 ms of traffic: a collective's megabytes wait in it instead of being dropped (with 50 ms,
    # a 16 MB allreduce at 1 Gbit/s lost packets and ran at 2/3 of the rate); the link stays the limit.
    # A peak rate just above the rate, over 128 KB: without it the bucket, refilled while the ranks compute,
    # let the next step's first 1.25 MB out at memory speed (a 1 MB allreduce after a pause took 1.5 ms at
    # "1 Gbit/s"), which no real NIC does and which flattered whatever sends little.
    return ["tbf", "rate", str(bits), "burst", str(burst), "latency", "500ms", "peakrate", str(int(bits * 1.01)),
            "mtu", str(128 * 1024)]


def set_rate(rate: str, device: str = IFACE, env: dict | None = None) -> None:
    """Limit this node's outgoing traffic to ``rate`` from now on, while the job runs: called by a rank inside
    an emulated node (``gpurig emulate``), e.g. to see what a program does when the network slows down. On two
    nodes, when every node calls it, that is the whole link.

    >>> set_rate("100mbit")      # in every rank of `gpurig emulate --nodes 2 --rate 10gbit -- ...`  # doctest: +SKIP
    >>> set_rate("100mbit", env={})                   # anywhere else: a real host's NIC is not touched
    Traceback (most recent call last):
    ...
    RuntimeError: set_rate limits an emulated node's link: not on one (gpurig emulate sets GPURIG_EMULATOR_NODES)
    """
    if MAP_VARIABLE not in (os.environ if env is None else env):
        raise RuntimeError(f"set_rate limits an emulated node's link: not on one (gpurig emulate sets {MAP_VARIABLE})")
    done = subprocess.run(["tc", "qdisc", "replace", "dev", device, "root", *tbf(rate)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise RuntimeError(f"tc qdisc replace dev {device}: {done.stderr.strip()}")


def unavailable() -> str | None:
    """Why namespaces cannot be used here, or None when they can.

    >>> unavailable() in (None,) or isinstance(unavailable(), str)
    True
    """
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (iproute2 / util-linux)"
    probe = f"gpurig-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


@dataclass
class Cluster:
    """``nodes`` namespaces on one subnet, every link limited to ``rate``. Use as a context manager.

    >>> with Cluster(nodes=2, rate="1gbit") as cluster:     # doctest: +SKIP
    ...     cluster.run(["python", "train.py"], engine="mpi")
    0
    """

    nodes: int = 2
    rate: str = "1gbit"
    owner: int = field(default_factory=os.getpid)
    namespaces: list[str] = field(default_factory=list)

    @property
    def tag(self) -> int:
        return 20 + self.owner % 200

    @property
    def subnet(self) -> str:
        return f"10.77.{self.tag}.0/24"

    def address(self, k: int) -> str:
        return f"10.77.{self.tag}.{k + 1}"

    def namespace(self, k: int) -> str:
        return f"gpurig{self.owner}n{k + 1}"

    @property
    def hub(self) -> str:
        return f"gpurig{self.owner}hub"

    def node_map(self) -> dict:
        """address → (namespace, hostname), what the rsh agent needs to reach a node."""
        return {self.address(k): [self.namespace(k), f"node{k + 1}"] for k in range(self.nodes)}

    # -- bring up, tear down ------------------------------------------------------
    def __enter__(self) -> "Cluster":
        if self.nodes < 2:
            raise UsageError(f"--nodes must be at least 2, got {self.nodes}")
        reason = unavailable()
        if reason:
            raise UsageError(f"cannot emulate nodes here: {reason}")
        remove_orphans()
        try:
            self._up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    def _ip(self, *args: str) -> None:
        done = subprocess.run(["ip", *args], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")

    def _limit(self, namespace: str, device: str) -> None:
        self._ip("netns", "exec", namespace, "tc", "qdisc", "add", "dev", device, "root", *tbf(self.rate))

    def _up(self) -> None:
        for k in range(self.nodes):
            self._ip("netns", "add", self.namespace(k))
            self.namespaces.append(self.namespace(k))
            self._ip("-n", self.namespace(k), "link", "set", "lo", "up")
        if self.nodes == 2:
            a, b = self.namespace(0), self.namespace(1)
            self._ip("link", "add", IFACE, "netns", a, "type", "veth", "peer", "name", IFACE, "netns", b)
        else:
            self._ip("netns", "add", self.hub)
            self.namespaces.append(self.hub)
            self._ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
            self._ip("-n", self.hub, "link", "set", "br0", "up")
            for k in range(self.nodes):
                port = f"v{k + 1}"
                self._ip("link", "add", IFACE, "netns", self.namespace(k), "type", "veth", "peer", "name", port,
                         "netns", self.hub)
                self._ip("-n", self.hub, "link", "set", port, "master", "br0")
                self._ip("-n", self.hub, "link", "set", port, "up")
                self._limit(self.hub, port)  # traffic towards node k
        for k in range(self.nodes):
            ns = self.namespace(k)
            self._ip("-n", ns, "addr", "add", f"{self.address(k)}/24", "dev", IFACE)
            self._ip("-n", ns, "link", "set", IFACE, "up")
            self._limit(ns, IFACE)  # traffic from node k

    def down(self) -> None:
        """Delete every namespace this cluster made (their links go with them).

        A rank still exiting keeps its namespace busy for a moment (seen on a loaded machine): each
        deletion is tried again for up to 5 s rather than left for the next run's orphan sweep.
        """
        for ns in reversed(self.namespaces):
            for _ in range(20):
                if subprocess.run(["ip", "netns", "del", ns], capture_output=True).returncode == 0:
                    break
                time.sleep(0.25)
        self.namespaces.clear()

    # -- run a job ---------------------------------------------------------------------
    def enter(self, k: int) -> list[str]:
        """The command prefix that runs a program as node k (its namespace and hostname)."""
        return [sys.executable, "-m", "gpurig.launch.emulator", "enter", self.namespace(k), f"node{k + 1}", "--"]

    def run(self, command: list[str], engine: str = "mpi", ranks_per_node: int = 1, env: dict | None = None,
            max_restarts: int = 0) -> int:
        """Run ``command`` on every node (``ranks_per_node`` each); return the job's exit code. With
        ``max_restarts`` the job starts again after a failure (MPI: without the nodes that are gone)."""
        nprocs = self.nodes * ranks_per_node
        env = {**(os.environ if env is None else env), MAP_VARIABLE: json.dumps(self.node_map()),
               "GLOO_SOCKET_IFNAME": IFACE, IFACE_VARIABLE: IFACE}
        made = None if DOWN_VARIABLE in env else tempfile.mkdtemp(prefix="gpurig-emulate-")
        if made:
            env[DOWN_VARIABLE] = os.path.join(made, "down")
        try:
            return self._run(command, engine, ranks_per_node, nprocs, env, max_restarts)
        finally:
            if made:
                shutil.rmtree(made, ignore_errors=True)

    def _run(self, command, engine, ranks_per_node, nprocs, env, max_restarts) -> int:
        # All "nodes" share this machine's cores: more threads than cores makes OpenMP spin against itself.
        env = host_defaults(env, ranks_here=nprocs)
        if engine == "mpi":
            hosts = ",".join(f"{self.address(k)}:{ranks_per_node}" for k in range(self.nodes))
            agent = f"{sys.executable} -m gpurig.launch.emulator agent"
            mpi_args = (f"--mca plm_rsh_agent {shlex.quote(agent)} --mca btl tcp,self "
                        f"--mca btl_tcp_if_include {self.subnet} --mca oob_tcp_if_include {self.subnet} "
                        # Open MPI's default allreduce reaches 0.31 of a link on 3 nodes, its ring 0.85
                        "--mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm 4")
            line = self.enter(0) + [sys.executable, "-m", "gpurig", "run", "-n", str(nprocs), "--hosts", hosts,
                                    "--mpi-args", mpi_args, "--max-restarts", str(max_restarts), "--", *command]
            return wait_passing_on(subprocess.Popen(line, env=env))
        return self._run_torch(command, nprocs, ranks_per_node, env, max_restarts)

    def _run_torch(self, command: list[str], nprocs: int, ranks_per_node: int, env: dict,
                   max_restarts: int = 0) -> int:
        """torch ranks, spawned and watched here, each entering its node; the first failure is named, and the job
        started again up to ``max_restarts`` times (every node stays: a lost host is an MPI-only notion here)."""
        from gpurig.launch.env import MAX_RESTARTS_VARIABLE, RESTART_VARIABLES
        from gpurig.launch.job import restart_notice, summary
        from gpurig.launch.processes import as_rank_program
        from gpurig.launch.rank_env import rank_path

        program = [sys.executable, "-m", "gpurig.launch.emulator", "task", "--",
                   *as_rank_program(command, rank_path(env))]
        env = {**env, MAX_RESTARTS_VARIABLE: str(max_restarts)}
        for attempt in range(max_restarts + 1):
            # a port of its own per attempt: the last attempt's store may still hold its port
            failure = self._torch_attempt(program, nprocs, ranks_per_node,
                                          {**env, **dict.fromkeys(RESTART_VARIABLES, str(attempt))}, 29500 + attempt)
            if failure is None:
                return 0
            print(summary(failure, nprocs - 1), file=sys.stderr, flush=True)
            if attempt < max_restarts:
                print(restart_notice(attempt + 1, max_restarts, nprocs), file=sys.stderr, flush=True)
        return failure.exit_code

    def _torch_attempt(self, program: list[str], nprocs: int, ranks_per_node: int, env: dict, port: int):
        """One start of the torch ranks: the first failure (as the ranks reported it), or None."""
        from gpurig.launch.env import RANK_HOST_VARIABLE
        from gpurig.launch.local import run_local
        from gpurig.launch.rank_env import rank_path
        from gpurig.launch.status import STATUS_DIR_VARIABLE, first_failure

        with tempfile.TemporaryDirectory(prefix="gpurig-emulate-") as status_dir:  # one filesystem for all nodes
            rank_envs = [{**env, "GPURIG_ENGINE": "torch", "RANK": str(rank), "WORLD_SIZE": str(nprocs),
                          "LOCAL_RANK": str(rank % ranks_per_node), "LOCAL_WORLD_SIZE": str(ranks_per_node),
                          "MASTER_ADDR": self.address(0), "MASTER_PORT": str(port), "PATH": rank_path(env),
                          STATUS_DIR_VARIABLE: status_dir, "GPURIG_EMULATOR_NODE": str(rank // ranks_per_node),
                          RANK_HOST_VARIABLE: f"node{rank // ranks_per_node + 1}"}
                         for rank in range(nprocs)]
            failure = run_local(program, rank_envs)
            return failure and (first_failure(status_dir) or failure)


def wait_passing_on(process: subprocess.Popen, stop_s: float = STOP_S) -> int:
    """Wait for ``process`` (the job's ``gpurig run``); return its exit code. Told to stop by SIGTERM or SIGHUP
    (:class:`~gpurig.errors.Terminated`), pass the signal on and give it ``stop_s`` to stop its ranks (Ctrl-C
    reaches it from the terminal itself); killed only after that.

    >>> wait_passing_on(subprocess.Popen(["true"]))
    0
    """
    try:
        return process.wait()
    except Terminated as stopped:
        process.send_signal(stopped.signum)
        raise
    finally:
        try:
            process.wait(timeout=stop_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def remove_orphans() -> list[str]:
    """Delete namespaces left by emulators that were killed before they could clean up; return their names.

    >>> isinstance(remove_orphans(), list)     # doctest: +SKIP
    True
    """
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    removed = []
    for name in (line.split()[0] for line in listing.splitlines() if line.strip()):
        match = re.fullmatch(r"gpurig(\d+)(n\d+|hub)", name)
        if match and not os.path.exists(f"/proc/{match.group(1)}"):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
            removed.append(name)
    return removed


def _exec_in(namespace: str, hostname: str, command: list[str]) -> None:
    inner = f"hostname {shlex.quote(hostname)} && exec \"$@\""
    os.execvp("ip", ["ip", "netns", "exec", namespace, "unshare", "--uts", "sh", "-c", inner, "sh", *command])


def gone(env=None) -> set[str]:
    """The emulated nodes taken down (``GPURIG_EMULATOR_DOWN``'s file): their rsh agent refuses, as for a dead host.

    >>> gone({})
    set()
    """
    path = (os.environ if env is None else env).get(DOWN_VARIABLE)
    if not path or not os.path.isfile(path):
        return set()
    with open(path) as f:
        return {line.strip() for line in f if line.strip()}


def take_down_this_node(env=None) -> str:
    """Mark the emulated node this process runs on gone (``GPURIG_EMULATOR_DOWN``): no rank starts there again,
    as on a lost host. Returns its address.

    >>> take_down_this_node({})
    Traceback (most recent call last):
    ...
    RuntimeError: not on an emulated node (gpurig emulate sets GPURIG_EMULATOR_NODES and GPURIG_EMULATOR_DOWN)
    """
    import socket

    env = os.environ if env is None else env
    if MAP_VARIABLE not in env or DOWN_VARIABLE not in env:
        raise RuntimeError(f"not on an emulated node (gpurig emulate sets {MAP_VARIABLE} and {DOWN_VARIABLE})")
    me = socket.gethostname()
    address = next(a for a, (_, hostname) in json.loads(env[MAP_VARIABLE]).items() if hostname == me)
    with open(env[DOWN_VARIABLE], "a") as f:
        f.write(address + "\n")
    return address


def main(argv: list[str]) -> int:
    """``enter NS HOST -- CMD`` · ``task -- CMD`` (node from the environment) · ``agent [opts] ADDRESS CMD`` (mpirun's rsh)."""
    if argv[:1] == ["enter"] and len(argv) > 4 and argv[3] == "--":
        _exec_in(argv[1], argv[2], argv[4:])
    if argv[:2] == ["task", "--"]:
        nodes = json.loads(os.environ[MAP_VARIABLE])
        namespace, hostname = list(nodes.values())[int(os.environ["GPURIG_EMULATOR_NODE"])]
        _exec_in(namespace, hostname, argv[2:])
    if argv[:1] == ["agent"]:
        args = argv[1:]
        while args and args[0].startswith("-"):  # ssh options mpirun adds
            args = args[1:]
        address, remote = args[0], " ".join(args[1:])
        if address in gone():
            print(f"ssh: connect to host {address} port 22: No route to host", file=sys.stderr)
            return 255
        namespace, hostname = json.loads(os.environ[MAP_VARIABLE])[address]
        _exec_in(namespace, hostname, ["sh", "-c", remote])
    print(main.__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
