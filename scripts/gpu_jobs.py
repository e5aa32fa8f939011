"""Whole Atari jobs with the learner on each device, on the machine this runs on (step 5 of scripts/gpu_check.sh,
run when GPU_CHECK_JOBS_S is set): ours IMPALA async and ours PPO allreduce on Pong, the job files as they are with
``agent.device`` set, 8 games an acting rank, each stopped 40 s after its first env step and counted as
``mpirl bench atari`` counts (:func:`mpirl.bench.atari.impala_counts`, :func:`~mpirl.bench.atari.ppo_counts`).

    python scripts/gpu_jobs.py [--ranks 16] [--wall 40] [--devices cuda,cpu] [--runs /tmp/mpirl-gpu-jobs]

IMPALA runs a learner, 2 trajectory queues and as many actors as the ranks leave (an even number: each queue
serves the same number), PPO one worker a rank. Prints a JSON line a job (env frames/s collected, samples/s trained
counting every pass, the learner's busy share) and, for each algorithm, the first device's figures over the
others'. One run a job: a check of what a device buys a whole job on this machine, not a comparison with the
libraries (which a GPU machine without a network cannot install).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mpirl.bench import atari

def impala_ranks(ranks: int) -> int:
    """The most ranks up to ``ranks`` that give a learner, 2 queues and an even number of actors (at least 2)."""
    n = ranks - (ranks - 3) % 2
    if n < 5:
        raise SystemExit(f"gpu_jobs: --ranks: IMPALA needs 5 or more (a learner, 2 queues, 2 actors), got {ranks}")
    return n


def run(which: str, ranks: int, device: str, wall: float, runs: Path) -> dict:
    sets = (f'agent.device="{device}"',) + (("topology.buffers=2",) if which == atari.IMPALA else ())
    run_dir, took = atari.launch_ours(which, "pong", 1, wall, runs, sets, ranks=ranks,
                                      name=f"{atari.OUR_JOBS[which][0]}-{device}")
    c = atari.OUR_JOBS[which][3](run_dir, wall)
    return {"job": which, "device": device, "ranks": ranks, "frames/s": atari.frames_per_s(c),
            "trained/s": atari.trained_per_s(c), "learner_busy": c.get("learner_busy"), "seconds": c["seconds"],
            "command_seconds": took}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=16, help="ranks of a job (IMPALA: the most that fit its shape)")
    ap.add_argument("--wall", type=float, default=40.0, help="seconds a job, from its first env step")
    ap.add_argument("--devices", default="cuda,cpu", help="comma-separated agent.device values, in turn")
    ap.add_argument("--runs", default="/tmp/mpirl-gpu-jobs", help="where the run directories go")
    args = ap.parse_args(argv)
    devices = [d.strip() for d in args.devices.split(",") if d.strip()]
    if not devices or set(devices) - {"cuda", "cpu", "auto"} or not args.wall > 0 or args.ranks < 2:
        ap.error("--devices: cuda, cpu or auto, comma-separated; --wall > 0; --ranks >= 2")
    runs = Path(args.runs)
    runs.mkdir(parents=True, exist_ok=True)
    for which, ranks in ((atari.IMPALA, impala_ranks(args.ranks)), (atari.PPO, args.ranks)):
        got = []
        for device in devices:
            got.append(run(which, ranks, device, args.wall, runs))
            print(json.dumps(got[-1]), flush=True)
        for other in got[1:]:
            first = got[0]
            collected = first["frames/s"] / other["frames/s"]
            trained = first["trained/s"] / other["trained/s"]
            print(f"{which}: {first['device']} over {other['device']}: collected {collected:.2f}x, trained "
                  f"{trained:.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
