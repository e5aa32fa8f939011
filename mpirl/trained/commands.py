"""``mpirl play`` and ``mpirl export``: a run's trained policy played (and recorded) or written out, in one process
without MPI. Bad input (a run without a checkpoint, one of another format, a video the env cannot draw, a file that
exists) is one line and exit code 2, and leaves no partial file behind."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from mpirl.atomic import check_target
from mpirl.config import ConfigError
from mpirl.domain import bad_input as _fail


def cmd_play(args) -> int:
    from mpirl.trained.play import play
    from mpirl.trained.runs import load_trained
    from mpirl.envs.watched import headless
    from mpirl.trained.video import VideoFile, check_target
    if args.episodes < 1:
        return _fail(f"--episodes: at least 1, got {args.episodes}")
    if args.seed < 0:
        return _fail(f"--seed: a seed is >= 0, got {args.seed}")
    if not (args.fps > 0 and math.isfinite(args.fps)):
        return _fail(f"--fps: frames a second, a finite number > 0, got {args.fps}")
    video = None
    try:
        if args.video:
            check_target(Path(args.video), args.force)
            headless()  # before the policy's env spaces import mujoco: how it will draw is chosen then
        policy, path = load_trained(args.run_dir, args.checkpoint, args.device)
        if args.stochastic and not policy.stochastic:
            return _fail(f"--stochastic: {policy.cfg.agent.algorithm}'s policy is greedy (a Q-function's best action); "
                         "leave --stochastic out")
        print(f"mpirl: playing {policy.cfg.env.id} with {path}, {policy.source}", flush=True)
        if args.video:
            video = VideoFile(Path(args.video), args.fps)
        played = play(policy, args.episodes, args.seed, not args.stochastic, video.add if video else None)
        if video is not None:
            video.close()
    except ConfigError as err:
        if video is not None:
            video.discard()
        return _fail(str(err))
    except BaseException:
        if video is not None:
            video.discard()
        raise
    print(f"mpirl: {played.line()}", flush=True)
    if video is not None:
        print(f"mpirl: video {args.video} ({played.frames} frames at {args.fps:g} per second)", flush=True)
    return 0


def cmd_export(args) -> int:
    from mpirl.trained.export import export
    from mpirl.trained.runs import load_trained
    out = Path(args.out)
    if args.seed < 0:
        return _fail(f"--seed: a seed is >= 0, got {args.seed}")
    try:
        check_target("--out", out, args.force)
        for flag, suffix in (("--onnx", ".onnx"), ("--pt2", ".pt2")):
            if not getattr(args, flag[2:]):
                continue
            if out.suffix == suffix:
                return _fail(f"{flag}: its file goes to {out.with_suffix(suffix)}, which is --out itself; name --out "
                             "policy.pt")
            check_target(flag, out.with_suffix(suffix), args.force)  # beside --out: the same directory
        policy, path = load_trained(args.run_dir, args.checkpoint, "cpu")
        written = export(policy, out, onnx=args.onnx, seed=args.seed, pt2=args.pt2)
    except ConfigError as err:
        return _fail(str(err))
    except RuntimeError as err:  # the traced module did not act as the policy: a fault of ours, not of the input
        print(f"mpirl: export failed: {err}", file=sys.stderr, flush=True)
        return 1
    print(f"mpirl: exported {path}, {policy.source}", flush=True)
    for line in written:
        print(f"mpirl: {line}", flush=True)
    return 0


def add_parsers(sub) -> None:
    """The two commands' parsers, on ``mpirl``'s subcommands."""
    run_help = "a run directory (or a directory of runs: the newest)"
    sp = sub.add_parser("play", help="play a run's trained policy: returns, and a video with --video")
    sp.add_argument("run_dir", help=run_help)
    sp.add_argument("--checkpoint", help="a checkpoint file of the run (default: its newest)")
    sp.add_argument("--episodes", type=int, default=10, help="episodes to play (default 10)")
    sp.add_argument("--seed", type=int, default=0, help="seeds the episodes' resets: the same seed, the same episodes")
    sp.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:K or auto")
    sp.add_argument("--stochastic", action="store_true",
                    help="sample actions from an actor-critic's distribution (as its actors and test rounds do) "
                         "instead of its most likely action")
    sp.add_argument("--video", metavar="FILE.mp4", help="record the episodes as an MP4, a frame per step")
    sp.add_argument("--fps", type=float, default=30.0, help="the video's frames a second (default 30)")
    sp.add_argument("--force", action="store_true", help="replace an existing video file")
    sp.set_defaults(func=cmd_play)

    sp = sub.add_parser("export", help="write a run's trained policy as TorchScript (torch.jit.load, no mpirl needed)")
    sp.add_argument("run_dir", help=run_help)
    sp.add_argument("--out", required=True, help="the TorchScript file to write, e.g. policy.pt")
    sp.add_argument("--checkpoint", help="a checkpoint file of the run (default: its newest)")
    sp.add_argument("--pt2", action="store_true",
                    help="a torch.export program beside it too (FILE.pt2: torch.export.load(path).module())")
    sp.add_argument("--onnx", action="store_true", help="an ONNX file beside it too (needs the onnx package)")
    sp.add_argument("--seed", type=int, default=0, help="seeds the episodes whose observations check the export")
    sp.add_argument("--force", action="store_true", help="replace existing files")
    sp.set_defaults(func=cmd_export)


if __name__ == "__main__":  # for a quick look: python -m mpirl.trained.commands play RUN_DIR
    p = argparse.ArgumentParser(prog="mpirl")
    add_parsers(p.add_subparsers(dest="command", required=True))
    a = p.parse_args()
    sys.exit(a.func(a))
