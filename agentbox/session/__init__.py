"""One launch: decided once (session.prepare), staged, run in one `limactl shell`; kept sessions.

May import review, sync, credentials, runtime, vm, remote, config, agents, net, git and the ground floor.
"""
