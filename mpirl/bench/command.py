"""``mpirl bench``'s command line: its arguments, each checked (one line and exit 2 for a bad one), then
:func:`mpirl.bench.suite.run`."""

from __future__ import annotations

import math
from pathlib import Path

from mpirl.atomic import check_target
from mpirl.bench.continuous import LONG_TASKS, TASKS
from mpirl.bench.suite import BENCHES
from mpirl.domain import ConfigError, bad_input


def add_parser(sub) -> None:
    sp = sub.add_parser("bench", help="benchmarks: ours vs a reference or the physical limit, side by side")
    sp.add_argument("what", choices=["all", *BENCHES])
    sp.add_argument("--reps", type=int, default=5,
                    help="repetitions per measurement (median, min-max; >= 5, or >= 3 for continuous's long rows "
                         "alone: hopper, halfcheetah, novelocity)")
    sp.add_argument("--out", help="HDF5 file for the numbers (default bench/bench-DATE.h5; never overwritten)")
    sp.add_argument("--breakout-wall", type=float, default=60.0, metavar="SECONDS",
                    help="impala: seconds of each MinAtar Breakout throughput run, after the CartPole rows "
                         "(default 60; 0 leaves them out)")
    sp.add_argument("--breakout-steps", type=int, default=None, metavar="N",
                    help="impala: end each side's Breakout run at N env steps too, whichever comes first with "
                         "--breakout-wall (an event, the same count a side; our wall counts our ranks' start-up)")
    sp.add_argument("--tasks", default=",".join(TASKS),
                    help=f"continuous: the rows to run, comma-separated (default all: {','.join(TASKS)}; the MuJoCo "
                         "ones take about 10 minutes a run, novelocity's up to 5)")
    sp.add_argument("--atari-wall", type=float, default=60.0,
                    help="atari: seconds of each run, on each side's own clock from its first env step (default 60)")
    sp.add_argument("--game", choices=["pong", "breakout"], default="pong", help="atari: the ALE game (default pong)")
    sp.add_argument("--device", choices=["all", "cpu", "cuda"], default="all",
                    help="learner: where ours and the bare step run (default all: the CPU, and CUDA when present); "
                         "gpu: cuda or all (on CUDA; without it the list of what it would run), cpu (a rehearsal at "
                         "tiny sizes)")
    sp.set_defaults(func=cmd_bench)


def problem(args, tasks: tuple[str, ...]) -> str | None:
    """What is wrong with the arguments, naming the flag and the fix; None when nothing is."""
    least = 3 if args.what == "continuous" and tasks and set(tasks) <= set(LONG_TASKS) else 5
    if args.reps < least:
        alone = "" if least == 3 else f" (3 for `--tasks` of {', '.join(LONG_TASKS)} alone: many minutes a seed)"
        return f"--reps: at least {least} repetitions make a median with a range, got {args.reps}{alone}"
    if not args.breakout_wall >= 0:
        return f"--breakout-wall: seconds >= 0 (0 leaves the Breakout rows out), got {args.breakout_wall:g}"
    if args.breakout_steps is not None and args.breakout_steps < 1:
        return f"--breakout-steps: env steps >= 1 (leave it out for the wall alone), got {args.breakout_steps}"
    if args.breakout_steps is not None and args.what not in ("impala", "all"):
        return (f"--breakout-steps: only `mpirl bench impala` (or all) has Breakout rows (got `mpirl bench "
                f"{args.what}`); leave --breakout-steps out")
    if args.breakout_steps is not None and args.breakout_wall == 0:
        return ("--breakout-steps: --breakout-wall 0 leaves the Breakout rows out; give it a wall > 0 or leave "
                "--breakout-steps out")
    if not (math.isfinite(args.atari_wall) and args.atari_wall > 0):
        return f"--atari-wall: seconds > 0 (each side's own clock from its first env step), got {args.atari_wall:g}"
    if args.device != "all":
        if args.what not in ("learner", "gpu"):
            return (f"--device: only `mpirl bench learner` takes a device, and `mpirl bench gpu` (cpu: its "
                    f"rehearsal) (got `mpirl bench {args.what}`); leave --device out")
        import torch
        if args.what == "learner" and args.device == "cuda" and not torch.cuda.is_available():
            return ("--device: 'cuda' but torch sees no CUDA device here; use 'cpu', or 'all' (the CPU and CUDA "
                    "when present)")
    unknown = [t for t in tasks if t not in TASKS]
    if unknown or not tasks:
        return f"--tasks: comma-separated names of {', '.join(TASKS)}, got {args.tasks!r}"
    if args.what != "continuous" and args.tasks != ",".join(TASKS):
        return f"--tasks: only `mpirl bench continuous` takes tasks (got `mpirl bench {args.what}`); leave --tasks out"
    return None


def cmd_bench(args) -> int:
    import datetime as dt

    from mpirl.bench.suite import run
    tasks = tuple(t.strip() for t in args.tasks.split(",") if t.strip())
    wrong = problem(args, tasks)
    if wrong:
        return bad_input(wrong)
    out = Path(args.out or f"bench/bench-{dt.datetime.now():%Y%m%d-%H%M%S}.h5")
    if args.out:  # (the default's bench/ is made for it)
        try:
            check_target("--out", out, force=False, forced="")
        except ConfigError as err:
            return bad_input(str(err))
    elif out.exists():
        return bad_input(f"--out: {out} exists; pass a new file name (results are never overwritten)")
    return run(args.what, args.reps, out, impala={"breakout_wall": args.breakout_wall,
                                                   "breakout_steps": args.breakout_steps},
               learner={"device": args.device}, continuous={"tasks": tasks}, gpu={"device": args.device},
               atari={"wall": args.atari_wall, "game": args.game})
