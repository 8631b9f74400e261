"""History across commits: asv benchmarks that measure training per commit, and what changed between them.

asv walks the commits and keeps its figures; ckptbench measures each point and judges each change.
"""
