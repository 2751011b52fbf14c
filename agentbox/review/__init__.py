"""Taking the agent's work back: checkpoints, diffs, undo, isolated mode's proposals and their checks.

May import vm, remote, config, agents, net, git and the ground floor.
"""
