"""Workspaces' git data read by agentbox itself, and agentbox's own checkpoint store (the one git runner).

May import the ground floor only.
"""
