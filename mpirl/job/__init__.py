"""The generic job: what every job has whatever its algorithm (wiring, checks, context, checkpoints, preemption)
and the contract an algorithm implements."""
