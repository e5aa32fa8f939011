"""The actor → buffer → learner family (Ape-X, QMIX, IMPALA): the loops of its actors, inference workers, buffers
and learners, over the parts each algorithm provides."""
