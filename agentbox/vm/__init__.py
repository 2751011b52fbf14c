"""The project VM: limactl (vm.lima, the only module that runs it), rendering, the base, the lifecycle.

May import review, config, agents, net, git and the ground floor.
"""
