"""``mpirl info`` and ``mpirl watch`` for an Ape-X run: the learner-buffer-actor summary of
:mod:`mpirl.metrics.summary` and its frame (:mod:`mpirl.metrics.watch`)."""

from mpirl.metrics.summary import format_summary, summarize
from mpirl.metrics.watch import frame

__all__ = ["format_summary", "frame", "summarize"]
