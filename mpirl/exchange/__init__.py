"""The exchange family: workers that learn on their own environments and exchange what they learned with a central
server (DistQL's tabular workers and Q-server). Its loops (``server.py``, ``worker.py``), their messages
(``messages.py``) and checkpoints (``checkpoint.py``) name no algorithm: an algorithm supplies an
:class:`~mpirl.exchange.builder.ExchangeBuilder`. Never imports torch."""
