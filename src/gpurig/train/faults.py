"""Fault injection for chaos testing: one rank sends itself a signal at a chosen training step.

``GPURIG_FAULT="rank=1 step=37 signal=SIGSTOP delay=0.004"`` makes rank 1 of a
``gpurig train`` job stop itself 4 ms into its 37th step (counted over the whole
run, from 1), wherever that lands: in the forward pass, in backward, inside a
bucket's allreduce. ``SIGKILL`` kills it; ``host=lost`` first marks its emulated node gone (``gpurig
emulate``: no rank starts there again, as on a machine that died). Nothing happens without the variable.
With ``GPURIG_FAULT_LOG=FILE`` the rank writes the time (``time.time()``) it
fired into FILE first. The fault fires in a job's first attempt only: a job
restarted after it (``--max-restarts``) runs on; with ``GPURIG_FAULT_LOG`` its
ranks add the time of their first step there (``resumed TIME``).
``benchmarks/chaos.py`` and ``benchmarks/restart_chaos.py`` draw these at random, from a seed.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass

from gpurig.launch.env import restart_count

FAULT_VARIABLE = "GPURIG_FAULT"
LOG_VARIABLE = "GPURIG_FAULT_LOG"


@dataclass(frozen=True)
class Fault:
    """Where and how a rank fails (see the module's docstring).

    >>> Fault.parse("rank=1 step=37 signal=SIGSTOP delay=0.004")
    Fault(rank=1, step=37, signal='SIGSTOP', delay=0.004, host_lost=False)
    """

    rank: int
    step: int
    signal: str = "SIGKILL"
    delay: float = 0.0
    host_lost: bool = False

    @classmethod
    def parse(cls, text: str) -> "Fault":
        """The fault ``GPURIG_FAULT``'s text describes (the class example); ValueError for a bad one."""
        fields = dict(item.split("=", 1) for item in text.split())
        fault = cls(int(fields["rank"]), int(fields["step"]), fields.get("signal", "SIGKILL"),
                    float(fields.get("delay", 0)), fields.get("host", "up") == "lost")
        if fault.signal not in signal.Signals.__members__ or fault.step < 1 or fault.delay < 0 or \
                fields.get("host", "up") not in ("up", "lost"):
            raise ValueError(f"{FAULT_VARIABLE}={text!r}: want rank=R step=S (from 1) [signal=SIGKILL] [delay=s] "
                             "[host=lost]")
        return fault

    def __str__(self) -> str:
        return f"rank={self.rank} step={self.step} signal={self.signal} delay={self.delay:g}" + \
            (" host=lost" if self.host_lost else "")


def planned(env=None) -> Fault | None:
    """The fault ``GPURIG_FAULT`` asks for, or None.

    >>> planned({}) is None
    True
    """
    text = (os.environ if env is None else env).get(FAULT_VARIABLE)
    return Fault.parse(text) if text else None


class Injector:
    """Called once per training step by the rank; fires the planned fault on its rank and step.

    >>> injector = Injector(rank=0, env={})
    >>> injector.step(1)      # no fault planned: nothing happens
    """

    def __init__(self, rank: int, env=None):
        env = os.environ if env is None else env
        fault = planned(env)
        self.restarted = restart_count(env) > 0
        self.fault = fault if fault is not None and fault.rank == rank and not self.restarted else None
        self._log = env.get(LOG_VARIABLE) if fault is not None and self.restarted else None
        self._steps = 0

    def step(self, steps_done_before: int | None = None) -> None:
        """A step begins (the run's ``steps_done_before + 1``-th, or the next one)."""
        self._steps = self._steps + 1 if steps_done_before is None else steps_done_before + 1
        if self._log:  # the first step after a restart: how long the fault cost is measured up to here
            with open(self._log, "a") as f:
                f.write(f"resumed {time.time()}\n")
            self._log = None
        if self.fault is None or self._steps != self.fault.step:
            return
        timer = threading.Timer(self.fault.delay, self._fire)
        timer.daemon = True
        timer.start()

    def _fire(self) -> None:
        if self.fault.host_lost:
            from gpurig.launch.emulator import take_down_this_node

            take_down_this_node()
        log = os.environ.get(LOG_VARIABLE)
        if log:
            with open(log, "w") as f:
                f.write(f"{time.time()}\n")
        os.kill(os.getpid(), signal.Signals[self.fault.signal])
