"""The VM's network policy (network.*) and the host-side egress proxy that enforces it.

May import the ground floor (agentbox.errors, paths, fsutil, progress, ...) only.
"""
