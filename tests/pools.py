"""The process pool the tests hand to :func:`ckptbench.theory.extrapolate.extrapolation` (as the planner
does): two forked workers that start warm.

transformers imports its model code lazily, the first time a model is built (three seconds or more), and a
forked worker that has not got it pays that on its first simulation, each worker again.  Importing the
fork server's warm-up (:mod:`ckptbench.run.preload`: one model of each family on the ``meta`` device, no
kernel run, no thread pool started) before the fork lets the workers share it, as the sweep's workers do.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context


@contextlib.contextmanager
def simulation_pool(workers: int = 2) -> Iterator[ProcessPoolExecutor]:
    import ckptbench.run.preload  # noqa: F401  (imported for its warm-up)

    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("fork")) as pool:
        yield pool
