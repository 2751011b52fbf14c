"""Background tasks (`agentbox run`): their states and records on the host.

May import vm, remote, review, config, agents, net, git and the ground floor.
"""
