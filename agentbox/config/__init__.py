"""agentbox's config: the key table, validation, loading and merging, trust and pinned host paths.

May import agents, net, git and the ground floor.
"""
