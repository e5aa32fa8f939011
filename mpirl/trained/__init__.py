"""A trained policy outside its job: load it from a run's checkpoint (:mod:`mpirl.trained.runs`), play and record it
(:mod:`mpirl.trained.play`, :mod:`mpirl.trained.video`), export it as TorchScript (:mod:`mpirl.trained.export`).

It sits above the algorithms, as the command line does: each algorithm builds its own policy
(``mpirl/algos/<name>/trained.py``, held to :class:`~mpirl.job.contract.Trained`), and nothing here names one.
"""
