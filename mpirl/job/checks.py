"""Checks of a job that need no MPI: world size, environment, network, memory. Used by run, launch, validate.

The algorithm (a module of :mod:`mpirl.algos`, passed in by the caller: this layer never names one)
checks its world size, environment and network and estimates each rank's memory; the checks here are
the ones every algorithm shares: the run directory, and the memory against this node.
"""

from __future__ import annotations

import os
from pathlib import Path

from mpirl.comm import codec
from mpirl.config import ConfigError, JobConfig
from mpirl.job import memory
from mpirl.job.contract import Algorithm, Checked
from mpirl.metrics import tensorboard


def check_job(cfg: JobConfig, algo: Algorithm, world_size: int, job_path: str) -> Checked:
    """Everything that can be checked without messages.

    Memory: the biggest single rank must fit in this node's available memory (where the
    other ranks run is only known inside the job, which checks each node's sum).
    """
    checked = algo.check(cfg, world_size, job_path)
    check_out_dir(cfg)
    tensorboard.check(cfg)  # the optional packages a [log] setting and the link's compression need
    codec.check(cfg.comm.link)
    est = checked.memory
    memory.check_fits(cfg, est, memory.LIBRARIES + est.largest(),
                      "one node (its largest rank alone)", memory.available_bytes(), largest_only=True)
    return checked


def check_out_dir(cfg: JobConfig) -> None:
    """``run.out_dir`` exists as a writable directory, or can be made (its nearest existing ancestor is one)."""
    path = Path(cfg.run.out_dir).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    if not path.is_dir():
        raise ConfigError("run.out_dir", f"cannot make run directories under {cfg.run.out_dir!r}: {str(path)!r} "
                                         "is not a directory; choose another run.out_dir")
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError("run.out_dir", f"cannot make run directories under {cfg.run.out_dir!r}: {str(path)!r} "
                                         "is not writable; choose another run.out_dir")


def check_local_job(cfg: JobConfig, algo: Algorithm, world_size: int, job_path: str) -> Checked:
    """:func:`check_job` for a job whose ranks all run on this node (``mpirl launch``): their sum must fit,
    and a CUDA learner needs CUDA here."""
    checked = check_job(cfg, algo, world_size, job_path)
    est = checked.memory
    memory.check_fits(cfg, est, est.total(), "this node (all ranks)", memory.available_bytes())
    if cfg.agent.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            raise ConfigError("agent.device", "'cuda' but this node has no usable CUDA device; "
                              "use 'auto' (CUDA when present) or 'cpu'")
    return checked
