"""Background work handed to a place (`agentbox run`, `--on HOST` sessions): submission, records, the keeper.

May import session, review, sync, credentials, runtime, vm, remote, config, agents, net, git and the ground floor.
"""
