"""Other machines: the far end run on a remote host (far.py, standalone) and its client.

May import review, config, agents, net, git and the ground floor.
"""
