"""How watchful a job is: the failure and stall timeouts and the collective checks, from flags or the environment.

``gpurig run`` and ``gpurig train`` take them as flags and hand them to every
rank as variables; a job started some other way (mpirun, torchrun) reads the
same variables:

  GPURIG_FAILURE_TIMEOUT  seconds within which a rank that died, was stopped or
                          hangs with the GIL held is reported (default 10; 0: off)
  GPURIG_STALL_TIMEOUT    seconds after which ranks still waiting for others at a
                          collective are reported, once per stall (default 60; 0: off)
  GPURIG_STALL_SHUTDOWN   seconds after which such a stall ends the job (default 0: never)
  GPURIG_CHECK            0 turns off the check that all ranks submit the same
                          collectives (default 1)
  GPURIG_COMM_TIMEOUT     seconds the torch engine's rendezvous and each of its
                          collectives wait before giving up (default 600, as
                          torch.distributed's own)
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from gpurig.errors import UsageError

VARIABLES = {"failure_timeout": "GPURIG_FAILURE_TIMEOUT", "stall_timeout": "GPURIG_STALL_TIMEOUT",
             "stall_shutdown": "GPURIG_STALL_SHUTDOWN", "check": "GPURIG_CHECK",
             "comm_timeout": "GPURIG_COMM_TIMEOUT"}
LONGEST_S = 7 * 24 * 3600.0


def seconds(text: str, what: str) -> float:
    """A duration in seconds from a flag or variable: finite, not negative; 0 means off.

    >>> seconds("2.5", "--failure-timeout")
    2.5
    >>> seconds("-1", "--failure-timeout")
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: --failure-timeout must be a number of seconds from 0 (off) to 604800, got '-1'
    """
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = math.nan
    if not 0 <= value <= LONGEST_S:
        raise UsageError(f"{what} must be a number of seconds from 0 (off) to {LONGEST_S:.0f}, got {text!r}")
    return value


@dataclass(frozen=True)
class Settings:
    """The settings of one job (see the module's table).

    >>> Settings.from_env({"GPURIG_FAILURE_TIMEOUT": "4"}).failure_timeout
    4.0
    """

    failure_timeout: float = 10.0
    stall_timeout: float = 60.0
    stall_shutdown: float = 0.0
    check: bool = True
    comm_timeout: float = 600.0

    @classmethod
    def from_env(cls, env=None) -> "Settings":
        """The settings the variables give (defaults for those not set); one-line error for a bad value.

        >>> Settings.from_env({"GPURIG_CHECK": "0"}).check, Settings.from_env({}).comm_timeout
        (False, 600.0)
        """
        env = os.environ if env is None else env
        values = {}
        for field, variable in VARIABLES.items():
            text = env.get(variable)
            if text in (None, ""):
                continue
            if field == "check":
                if text not in ("0", "1"):
                    raise UsageError(f"{variable} must be 0 or 1, got {text!r}")
                values[field] = text == "1"
            elif field == "comm_timeout":   # no "off": torch.distributed needs a limit
                try:
                    values[field] = seconds(text, variable)
                except UsageError:
                    values[field] = 0.0
                if values[field] == 0:
                    raise UsageError(f"{variable} must be a number of seconds above 0 (at most {LONGEST_S:.0f}), "
                                     f"got {text!r}")
            else:
                values[field] = seconds(text, variable)
        return cls(**values)


def job_environment(**timeouts: float | None) -> dict:
    """This process's environment plus the variable of every timeout given (None: left as it is), for the ranks;
    a bad value left in the environment is refused here, in one line, not by every rank.

    >>> job_environment(failure_timeout=4.0, stall_timeout=None)["GPURIG_FAILURE_TIMEOUT"]
    '4.0'
    """
    env = dict(os.environ)
    env.update({VARIABLES[field]: str(value) for field, value in timeouts.items() if value is not None})
    Settings.from_env(env)
    return env
