"""What agentbox knows about each agent it runs: command, flags, install, logins, endpoints, setup.

Data only: imports nothing of agentbox's.
"""
