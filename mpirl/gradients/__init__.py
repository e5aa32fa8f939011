"""The gradient family (the survey's fourth thing a worker sends): workers compute A2C or PPO gradients on their own
rollouts and exchange them with a parameter server (A3C and Gorila asynchronously, DPPO in rounds with stragglers)
or among themselves (DD-PPO's allreduce with straggler preemption). The loops of its server and workers, over the
parts an algorithm provides (:class:`mpirl.gradients.builder.GradientBuilder`)."""
