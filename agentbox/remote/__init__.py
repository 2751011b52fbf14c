"""Remote hosts over SSH: the transport (one multiplexed ssh connection per host) and the far end's client.

May import review, config, agents, net, git and the ground floor.
"""
