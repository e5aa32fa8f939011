"""A trained policy outside its job, from real runs: ``mpirl play`` (returns, seeds, videos whose frames are the
episodes' steps), ``mpirl export`` (TorchScript loaded in a Python without mpirl, the same actions), the Python API
(``mpirl.launch``, ``mpirl.load_policy``, ``mpirl.read_run``) and the refusals (exit 2, one line, nothing left)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig

import numpy as np
import pytest
import torch

import mpirl
from conftest import JOBS, ROOT, bad_targets, in_process as cli, mpi_env, run_cli, tree
from mpirl.trained.export import observations
from mpirl.trained.play import play
from mpirl.trained.video import VideoFile, count_frames

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A short Ape-X run on CartPole, launched through the Python API. The other families' policies are played and
    exported from runs their own tests make anyway (test_continuous, test_normalization, test_recurrent,
    test_qmix_job, test_distql)."""
    out = tmp_path_factory.mktemp("play")
    with pytest.MonkeyPatch.context() as mp:  # the jobs' temporary files where the tests' jobs keep theirs
        mp.setenv("TMPDIR", mpi_env()["TMPDIR"])
        return {"apex": mpirl.launch(JOBS / "cartpole.toml", quiet=True, **{
            "run.out_dir": str(out / "apex"), "run.train_steps": 300, "run.target_return": float("nan"),
            "replay.learning_starts": 300})}


def test_api_launch_and_read_run(runs):
    """launch returned the run directory; read_run gives every rank file's tables as DataFrames."""
    run = mpirl.read_run(runs["apex"])
    assert run.attrs["status"] == "completed" and run.job["agent.algorithm"] == "apex"
    train = run.tables["learner"]["train"]
    assert list(train.columns)[:2] and int(train["train_steps"].iloc[-1]) >= 300
    assert len(run.tables["buffer_1"]["episodes"]) > 0 and not run.notes
    with pytest.raises(mpirl.api.JobFailed) as failed:
        mpirl.launch(JOBS / "cartpole.toml", quiet=True, **{"replay.capcity": 5})
    assert failed.value.code == 2 and failed.value.run_dir is None and "capacity" in failed.value.said


def test_play_is_seeded_and_its_video_holds_every_step(runs, tmp_path):
    policy = mpirl.load_policy(runs["apex"])
    frames = []
    played = play(policy, 3, seed=5, frame=frames.append)
    assert len(played.returns) == 3 and played.frames == sum(played.lengths) == len(frames)
    assert frames[0].dtype == np.uint8 and frames[0].ndim == 3 and frames[0].shape[2] == 3
    video = tmp_path / "cartpole.mp4"
    proc = run_cli("play", str(runs["apex"]), "--episodes", "3", "--seed", "5", "--video", str(video))
    assert proc.returncode == 0, proc.stderr
    assert f"return {np.mean(played.returns):.1f}" in proc.stdout  # the same seed, the same episodes
    assert count_frames(video) == sum(played.lengths), proc.stdout
    assert [p.name for p in tmp_path.iterdir()] == ["cartpole.mp4"]  # no partial file beside it


def _site_packages_without_mpirl(tmp_path):
    """A script prefix that makes torch importable and mpirl not: no site (the editable install's finder is a .pth),
    the venv's site-packages appended by hand, the working directory elsewhere."""
    return (f"import sys; sys.path.append({sysconfig.get_paths()['purelib']!r}); import importlib.util; "
            "assert importlib.util.find_spec('mpirl') is None, 'mpirl is importable'; import torch, numpy as np; ")


def test_export_gives_the_same_actions_in_a_python_without_mpirl(runs, tmp_path, capsys):
    out = tmp_path / "policy.pt"
    proc = cli(capsys, "export", str(runs["apex"]), "--out", str(out), "--pt2")
    assert proc.returncode == 0 and "torch.export" in proc.stdout, proc.stderr
    policy = mpirl.load_policy(runs["apex"])
    obs, _ = observations(policy, 1_000, seed=3)
    np.save(tmp_path / "obs.npy", np.stack(obs))
    want, _ = policy.act(np.stack(obs))
    script = (_site_packages_without_mpirl(tmp_path)
              + f"m = torch.jit.load({str(out)!r}); x = torch.as_tensor(np.load({str(tmp_path / 'obs.npy')!r})); "
              f"np.save({str(tmp_path / 'got.npy')!r}, m(x).numpy()); "
              f"p = torch.export.load({str(out.with_suffix('.pt2'))!r}).module(); "
              f"np.save({str(tmp_path / 'got2.npy')!r}, p(x).numpy())")
    run = subprocess.run([sys.executable, "-I", "-S", "-c", script], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    got = np.load(tmp_path / "got.npy")
    assert len(got) == 1_000 and np.array_equal(got, want)
    assert np.array_equal(np.load(tmp_path / "got2.npy"), want)  # the torch.export program, too
    extra = {"mpirl.json": ""}
    torch.jit.load(str(out), _extra_files=extra)
    meta = json.loads(extra["mpirl.json"])
    assert meta["inputs"] == ["obs"] and meta["obs_shape"] == [4] and meta["env_id"] == "CartPole-v1"


def test_refusals_say_one_line_and_leave_nothing(runs, tmp_path, capsys):
    def refused(*args):
        proc = cli(capsys, *args)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
        return proc.stderr

    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(runs["apex"] / "run.h5", bare / "run.h5")
    assert "no checkpoint" in refused("play", str(bare))
    assert "does not exist" in refused("play", str(tmp_path / "nothing"))
    other = tmp_path / "other" / "ckpt-0000000001.pt"  # a checkpoint of another algorithm's shape
    other.parent.mkdir()
    torch.save({"format": 2, "identity": {}, "train_steps": 1, "job_time": 0.0, "model": {"net": {}}}, other)
    assert "another format" in refused("play", str(runs["apex"]), "--checkpoint", str(other))
    assert "not a checkpoint" in refused("play", str(runs["apex"]), "--checkpoint", str(bare / "run.h5"))
    (tmp_path / "taken.mp4").write_bytes(b"mine")
    assert "--force" in refused("play", str(runs["apex"]), "--video", str(tmp_path / "taken.mp4"))
    assert (tmp_path / "taken.mp4").read_bytes() == b"mine"
    assert ".mp4" in refused("play", str(runs["apex"]), "--video", str(tmp_path / "v.avi"))
    assert "greedy" in refused("play", str(runs["apex"]), "--stochastic")
    assert "--episodes" in refused("play", str(runs["apex"]), "--episodes", "0")
    (tmp_path / "p.pt").write_bytes(b"mine")
    assert "--force" in refused("export", str(runs["apex"]), "--out", str(tmp_path / "p.pt"))
    assert "--fps" in refused("play", str(runs["apex"]), "--fps", "inf")
    try:
        import onnx  # noqa: F401
    except ImportError:  # without the package: refused before anything is written
        assert "onnx" in refused("export", str(runs["apex"]), "--out", str(tmp_path / "o.pt"), "--onnx")
    if not torch.cuda.is_available():
        assert "CUDA" in refused("play", str(runs["apex"]), "--device", "cuda")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bare", "other", "p.pt", "taken.mp4"]
    # Every file-writing option, every place it cannot write: one line before anything is computed, nothing left.
    places = tmp_path / "places"
    places.mkdir()
    for command, option, suffix, more in (("play", "--video", ".mp4", ()), ("export", "--out", ".pt", ()),
                                          ("export", "--out", ".pt", ("--pt2",))):
        for path, extra, says in bad_targets(places, suffix):
            before = tree(places)
            assert says in refused(command, str(runs["apex"]), option, str(path), *more, *extra), (command, path)
            assert tree(places) == before, (command, path)  # no partial file, nothing replaced
        shutil.rmtree(places)
        places.mkdir()
    (places / "p.pt2").mkdir()  # the file --pt2 writes beside --out is checked as --out is
    assert "--pt2: " in refused("export", str(runs["apex"]), "--out", str(places / "p.pt"), "--pt2", "--force")
    assert [p.name for p in places.iterdir()] == ["p.pt2"]
    from mpirl.config import ConfigError
    with pytest.raises(ConfigError, match="RUN_DIR: .* does not exist"):  # as load_policy says it
        mpirl.read_run(tmp_path / "nothing")
    with pytest.raises(ConfigError, match="RUN_DIR: .* holds no run.h5"):
        mpirl.read_run(places)


def test_a_video_of_a_half_played_run_is_removed(runs, tmp_path):
    """A failure while recording (here: an episode that raises) leaves neither the video nor its partial file."""
    policy = mpirl.load_policy(runs["apex"])
    video = VideoFile(tmp_path / "v.mp4", 30)

    def frame(picture):
        video.add(picture)
        if video.frames == 5:
            raise RuntimeError("stop")
    with pytest.raises(RuntimeError):
        play(policy, 1, frame=frame)
    video.discard()
    assert list(tmp_path.iterdir()) == []


def test_readme_shows_play_export_and_the_api():
    text = (ROOT / "README.md").read_text()
    for needle in ("mpirl play", "mpirl export", "mpirl.load_policy", "mpirl.read_run", "mpirl.launch"):
        assert needle in text, needle


def test_an_export_that_acts_otherwise_is_not_written(runs, tmp_path):
    """The check is real: a policy whose own actions differ from its module's (here, shifted by one) is refused
    and leaves no file."""
    from mpirl.trained.export import export
    policy = mpirl.load_policy(runs["apex"])
    act = policy.act
    policy.act = lambda o, s=None, **kw: ((act(o, s, **kw)[0] + 1) % 2, None)
    with pytest.raises(RuntimeError, match="differs from the policy on"):
        export(policy, tmp_path / "p.pt")
    assert list(tmp_path.iterdir()) == []
