"""A3C, DPPO and DD-PPO as the gradient family (:mod:`mpirl.gradients`) sees them: its ``[a3c]`` settings, its
checks and validate line, and its builder (the actor-critic model, its rollouts, A2C's or PPO's gradients)."""
