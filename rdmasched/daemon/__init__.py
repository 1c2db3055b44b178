"""The node daemon: the sans-IO node core (core.py), its threaded driver (node.py), the loop
and the protocols they run (docs/DAEMON.md)."""
