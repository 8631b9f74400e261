"""Running a suite: the sweep driver, the fork-server runner, the worker's step loop, torchrun groups.

Everything here is about processes and their lifetimes (isolation, timeouts, faults, resume); what a step
does lives in :mod:`ckptbench.train`, what is seen in :mod:`ckptbench.measure`.
"""
