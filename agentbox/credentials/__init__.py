"""Host logins for the VM: which files are staged, and write-back of logins refreshed in the VM.

May import vm, remote, config, agents, net, git and the ground floor.
"""
