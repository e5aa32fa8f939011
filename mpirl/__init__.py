"""mpirl: distributed deep reinforcement learning as one MPI job."""

__version__ = "0.1.0"
