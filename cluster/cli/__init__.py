"""The `raftq` command: main.py parses the command line and runs nodes and local clusters;
commands.py holds the commands that talk to a running cluster."""
from .main import main

__all__ = ["main"]
