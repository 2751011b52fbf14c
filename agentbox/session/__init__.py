"""One launch: staging, the sandbox description, the launch itself, detached sessions, `agentbox run`.

May import every package but commands (and cli, doctor).
"""
