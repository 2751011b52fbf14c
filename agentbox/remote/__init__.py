"""Other machines: the SSH transport (one multiplexed ssh connection per host), the far end run there
(far.py, standalone) and its client, and the hosts agentbox knows.

May import review, config, agents, net, git and the ground floor.
"""
