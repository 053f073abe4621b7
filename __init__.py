"""raftq: a durable job queue with sepp's semantics, replicated by Raft.

One import name for users:

    from raftq import Client, SyncClient, Worker, Retry, RetryAfter, Permanent, LeaseLost

The package has two parts, kept in the repository's top-level folders: `raftq.node` (node/,
everything inside one server process; needs the `server` extra) and `raftq.cluster` (cluster/,
everything that talks to a cluster from outside: client, worker, command line, local launcher,
benchmark, chaos). The names below are loaded on first use, so `import raftq.node.core.machine`
does not pull in the client and a producer's `import raftq` does not pull in the server.
"""
from __future__ import annotations

__version__ = "0.2.1"

_EXPORTS = {
    "Client": "raftq.cluster.client", "SyncClient": "raftq.cluster.client",
    "Retry": "raftq.cluster.client", "LeaseLost": "raftq.cluster.client",
    "Job": "raftq.cluster.client", "DeadLetterRecord": "raftq.cluster.client",
    "EnqueueResult": "raftq.cluster.client", "RaftqError": "raftq.cluster.client",
    "Unavailable": "raftq.cluster.client", "Unreachable": "raftq.cluster.client",
    "Rejected": "raftq.cluster.client",
    "BatchRejected": "raftq.cluster.client", "Unauthenticated": "raftq.cluster.client",
    "PermissionDenied": "raftq.cluster.client",
    "Result": "raftq.cluster.client", "JobResult": "raftq.cluster.client",
    "Worker": "raftq.cluster.worker", "RetryAfter": "raftq.cluster.worker",
    "Permanent": "raftq.cluster.worker", "ExecutionTimeout": "raftq.cluster.worker",
}
__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'raftq' has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
