"""Imported first by the workers' fork server: from then on it dies with the sweep that started it, and
each worker it forks dies with it (see :func:`.lifeline.arm_fork_server`).  Anywhere else it does nothing."""

from __future__ import annotations

from .lifeline import arm_fork_server

arm_fork_server()
