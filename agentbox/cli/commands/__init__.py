"""Click commands, one module per group of verbs (cli.py loads each when its command runs).

May import every package of agentbox, and doctor; never cli.
"""
