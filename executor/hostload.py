"""How busy this machine's CPU cores are, for runs and calibrations timed on them.

A run on CPU processes (gloo) and `partita calibrate` time host work; when other processes keep the
cores busy, every measured time stretches and the prediction, made for free cores, falls short.
Linux's load average counts runnable tasks, averaged over one minute (proc(5), /proc/loadavg);
the cores a process may use are its CPU affinity set (sched_getaffinity(2)), which in a container
can be fewer than the machine's. No torch here.
"""
from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class HostLoad:
    load_1m: float          # runnable tasks, one-minute average
    cores: int              # cores this process may run on

    def busy_with(self, processes: int) -> bool:
        """Whether `processes` more busy processes would leave fewer cores than tasks."""
        return self.load_1m + processes > self.cores

    def to_dict(self) -> dict:
        return {"load_average_1m": round(self.load_1m, 2), "cores": self.cores}


def host_load() -> HostLoad | None:
    """This machine's load now; None where the OS does not report it."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return HostLoad(load_1m=load, cores=max(1, cores))


def load_warning(load: HostLoad | None, processes: int, what: str) -> str | None:
    """One line for the user when `what` (a run, a calibration) would share busy cores."""
    if load is None or not load.busy_with(processes):
        return None
    return (f"this machine is busy: load average {load.load_1m:.1f} on {load.cores} core(s) "
            f"before {what} adds {processes} process(es); its times will stretch beyond a "
            "prediction made for free cores")
