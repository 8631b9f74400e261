"""Probes: what a step actually allocated, saved, recomputed, timed and communicated.

Nothing in this package imports :mod:`ckptbench.theory`: a probe must not know what it is expected to find.
"""
