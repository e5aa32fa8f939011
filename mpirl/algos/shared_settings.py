"""Keys of the shared sections that the replay-based algorithms (``apex``, ``qmix``) read besides their own:
their stop conditions, the learner-buffer-actor layout and checkpoints. Standard library only."""

REPLAY_JOB_USES = {
    "run": ("train_steps", "env_steps", "wall_seconds", "target_return", "return_window", "return_from"),
    "topology": ("buffers", "actors", "node_local", "workers", "worker_batch", "worker_deadline_us"),
    "checkpoint": ("every_seconds", "every_steps", "keep", "replay"),
}
