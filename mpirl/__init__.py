"""mpirl: distributed deep reinforcement learning as one MPI job.

The Python API (:mod:`mpirl.api`): ``mpirl.launch(job, **overrides)``, ``mpirl.load_policy(run_dir)``,
``mpirl.read_run(run_dir)``; imported when first used (``import mpirl`` imports neither torch nor MPI).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mpirl.version import __version__

__all__ = ["launch", "load_policy", "read_run", "__version__"]

if TYPE_CHECKING:
    from mpirl.api import launch, load_policy, read_run  # noqa: F401


def __getattr__(name: str) -> Any:
    if name in ("launch", "load_policy", "read_run"):
        from mpirl import api
        return getattr(api, name)
    raise AttributeError(f"module 'mpirl' has no attribute {name!r}")
