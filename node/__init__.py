"""raftq node: everything that runs inside one server process."""
