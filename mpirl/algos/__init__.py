"""Algorithms: one folder each (``apex``, ``qmix``, ``impala``, ``distql``, ``a3c``), chosen by ``[agent] algorithm``.

A folder holds:

* ``settings.py`` — config layer (standard library, :mod:`mpirl.domain` and, for the replay-based
  algorithms, :mod:`mpirl.replay_job`): ``SECTIONS``, the job-file sections the algorithm owns
  (``{"qmix": QmixConfig}``); ``USES``, the keys of the shared sections (``run``, ``topology``, ``agent``,
  ``env``, ``replay``, ``comm``, ``checkpoint``) it reads — a job that sets any other key of those sections
  is refused, naming the key (every algorithm reads ``log`` and run's name, seed and out_dir);
  ``check(cfg)``, its cross-field checks (no MPI, no torch); ``world_size(cfg)``, the ranks a job needs by
  default.
* ``algorithm.py`` — :class:`~mpirl.job.contract.Algorithm`: ``check(cfg, world_size, job_path) -> Checked``
  (world size, environment, network, memory; no MPI), ``layout(cfg, world_size)`` (roles, ranks and links as
  data), ``build_topology(world, cfg)``, ``ROLES`` (role name -> loop taking a
  :class:`~mpirl.job.context.RoleContext` and returning the stop reason), ``rank_files(topo)`` (the
  per-rank HDF5 files ``run.h5`` links), ``role_map(topo)``, ``describe(cfg, world_size, checked)``
  (``validate``'s line), ``summary(run_dir)``.
* ``info.py`` — :class:`~mpirl.job.contract.Info`: ``summarize(run_dir)``, ``format_summary(summary)`` for
  ``mpirl info`` and ``frame(summary)`` for ``mpirl watch`` (no torch).
* its role loops and message layouts.

The contract is typed (:mod:`mpirl.job.contract`) and checked by mypy in the test suite through ``REGISTRY`` in
:mod:`mpirl.registry`: adding an algorithm is adding its folder and its line there.

:mod:`mpirl.job.wiring` wires any of them and never names one. Imports are lazy: a folder's
``__init__`` imports nothing, so a tabular job never imports torch.
"""
