"""``mpirl info`` for an Ape-X run: the summary of :mod:`mpirl.metrics.summary` (learner, buffers, actors)."""

from mpirl.metrics.summary import format_summary, summarize

__all__ = ["format_summary", "summarize"]
