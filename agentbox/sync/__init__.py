"""The agents' own setup (skills, settings, MCP servers) carried into the VM and back, and their updates.

May import vm, remote, config, agents, net, git and the ground floor.
"""
