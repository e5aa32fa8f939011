"""DistQL (Distributed Q-learning): tabular Q-learning workers, each with its own environment, and a Q-server
that merges their tables; the exchange asynchronous or synchronous. Its loops are the exchange family's
(:mod:`mpirl.exchange`), over :class:`~mpirl.algos.distql.builder.DistqlBuilder`. Never imports torch."""
