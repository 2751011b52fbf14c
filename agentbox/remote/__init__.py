"""Other machines: the ssh transport, the far end run there (far.py) and its client, the hosts agentbox knows.

May import config, agents, net, git and the ground floor.
"""
