"""Seeds together: runs grouped by their job but the seed, one PNG of each group's median curve with its
interquartile band, and a table of final values with the IQM and its bootstrap interval.

Usage::

    python analysis/compare.py RUN_DIR... [--y return|TABLE.COLUMN] [--x env_steps|train_steps|time]
                               [--out FILE.png] [--force] [--seed N]

The same as ``mpirl compare`` (the logic: mpirl/metrics/compare.py); exit code 2 on bad input, with one line.
"""
from __future__ import annotations

import sys

from mpirl.cli import main

if __name__ == "__main__":
    sys.exit(main(["compare", *sys.argv[1:]]))
