"""`raftq bench`: the cluster benchmark (runner.py) and the bare aiohttp server it measures HTTP
against (bare_server.py)."""
from .runner import main

__all__ = ["main"]
