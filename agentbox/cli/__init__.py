"""The command line: the entry point (no click on a launch), the click group and its commands, doctor's report.

May import every package of agentbox; nothing imports it.
"""
