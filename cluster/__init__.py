"""raftq cluster tools: everything that talks to a cluster from outside."""
