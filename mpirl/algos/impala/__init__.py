"""IMPALA (Espeholt et al. 2018): actors send whole trajectories of their own, possibly stale, policy; buffer ranks
queue them; the learner trains an actor-critic on batches of them with V-trace correcting the lag."""
