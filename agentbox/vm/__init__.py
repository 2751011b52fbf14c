"""The project VM: limactl (vm.lima, the only module that runs it), rendering, the base, the lifecycle, its mode.

May import config, agents, net, git and the ground floor.
"""
