"""DistQL (Distributed Q-learning): tabular Q-learning workers, each with its own environment, and a Q-server
that merges their tables; the exchange asynchronous or synchronous. Never imports torch."""
