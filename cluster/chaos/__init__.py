"""`raftq chaos`: a local cluster under faults, a recorded workload, and a checker.

* runner.py: the command (options, the run, the report);
* proxy.py: a fault-injecting TCP proxy on every Raft link (partitions, latency, resets);
* nemesis.py: the fault kinds and the schedule that draws them;
* workload.py: producers and workers through the client, every operation recorded;
* checker.py: the invariants, checked against the recorded history.
"""
from .runner import main

__all__ = ["main"]
