"""agentbox: run AI coding agents in a per-project Lima VM."""

__version__ = "0.1.0"
