"""Job files: defaults, overrides, and one clear error per kind of bad input."""

import math

import pytest

from mpirl import config, replay_job
from mpirl.config import ConfigError

from conftest import JOBS


def load(tmp_path, text, *sets):
    path = tmp_path / "job.toml"
    path.write_text(text)
    return config.load(path, sets)[0]


def test_shipped_job_loads_and_overrides():
    cfg, text = config.load(JOBS / "cartpole.toml", ["replay.architecture=baseline", "topology.buffers=2",
                                                     "agent.hidden=[64, 32]", "run.wall_seconds=5"])
    assert cfg.replay.architecture == "baseline" and cfg.topology.buffers == 2
    assert cfg.agent.hidden == [64, 32] and cfg.run.wall_seconds == 5.0
    assert cfg.run.target_return == 195.0 and "CartPole-v1" in text
    assert cfg.world_size == 7  # 1 learner + 2 buffers + 2 actors each by default


def test_ints_widen_to_floats_but_not_the_reverse(tmp_path):
    cfg = load(tmp_path, "[run]\ntrain_steps = 10\nwall_seconds = 3\n")
    assert isinstance(cfg.run.wall_seconds, float)
    with pytest.raises(ConfigError, match=r"run.train_steps: must be an integer >= 0 .*, got float 10.5"):
        load(tmp_path, "[run]\ntrain_steps = 10.5\n")


@pytest.mark.parametrize("text, key, words", [
    ("[replay]\ncapcity = 3\n", "replay.capcity", "did you mean 'capacity'"),
    ("[replays]\ncapacity = 3\n", "replays", "did you mean 'replay'"),
    ("[run]\ntrain_steps = true\n", "run.train_steps", "must be an integer >= 0 (0 disables it), got bool True"),
    ("[run]\ntrain_steps = 10\n[replay]\narchitecture = 'edge'\n", "replay.architecture", "'proposed', 'baseline'"),
    ("[run]\ntrain_steps = 10\n[replay]\nbatch_size = 64\ncapacity = 10\n", "replay.capacity", "at least one batch share"),
    ("[run]\ntrain_steps = 10\n[topology]\nbuffers = 0\n", "topology.buffers", "must be >= 1: the buffer ranks hold"),
    ("[run]\ntrain_steps = 10\n[topology]\nbuffers = -1\n", "topology.buffers", "must be an integer in [0, 4096]"),
    ("[run]\ntrain_steps = 10\n[topology]\nbuffers = 3\nactors = 2\n", "topology.actors", "each buffer has an actor"),
    ("[run]\ntrain_steps = 10\n[agent]\ngamma = 1.5\n", "agent.gamma", "(0, 1]"),
    ("[run]\ntrain_steps = 10\n[agent]\nhidden = [64, 0]\n", "agent.hidden", "layer widths such as [128, 128]"),
    ("[run]\ntrain_steps = 10\n[log]\nflush_seconds = 60\n", "log.flush_seconds", "killed job"),
    ("[run]\nseed = 1\n", "run", "stop condition"),
    ("[run\n", "", "not valid TOML"),
])
def test_bad_values_name_the_key(tmp_path, text, key, words):
    with pytest.raises(ConfigError) as err:
        load(tmp_path, text)
    assert err.value.key == key
    assert words in str(err.value)


def test_bad_overrides(tmp_path):
    with pytest.raises(ConfigError, match="section.key=value"):
        config.load(JOBS / "cartpole.toml", ["replay.architecture"])
    with pytest.raises(ConfigError, match="replay.capcity: unknown key"):
        config.load(JOBS / "cartpole.toml", ["replay.capcity=5"])
    with pytest.raises(ConfigError, match="job file .* not found"):
        config.load(tmp_path / "missing.toml")


def test_bare_string_overrides_need_no_quotes():
    assert config.parse_override("replay.architecture=baseline") == ("replay.architecture", "baseline")
    assert math.isnan(config.parse_override("run.target_return=nan")[1])


def test_world_size_message_gives_the_command_that_works():
    cfg, _ = config.load(JOBS / "cartpole.toml")
    replay_job.check_world_size(cfg, 4)
    replay_job.check_world_size(cfg, 9)  # actors = 0: the rest of the world acts
    with pytest.raises(ConfigError, match=r"MPI world has 2 rank\(s\); run: mpirl launch -n 4 J.toml"):
        replay_job.check_world_size(cfg, 2, "J.toml")
    cfg.topology.actors = 3
    replay_job.check_world_size(cfg, 5)
    with pytest.raises(ConfigError, match=r"1 learner \+ 1 buffer\(s\) \+ 3 actor\(s\).*has 4"):
        replay_job.check_world_size(cfg, 4)
    assert replay_job.actor_count(cfg, 5) == 3


@pytest.mark.parametrize("job", sorted(p.name for p in JOBS.glob("*.toml")))
def test_every_shipped_job_validates(job):
    from mpirl import registry
    from mpirl.job.checks import check_job
    cfg, _ = config.load(JOBS / job)
    n = cfg.world_size
    if cfg.env.id.startswith("ALE/"):
        import ale_py  # noqa: F401  (in the test extra: a missing one fails)
    spaces = check_job(cfg, registry.algorithm(cfg.agent.algorithm), n, str(JOBS / job)).spaces
    if cfg.agent.algorithm != "apex":
        return
    obs_shape, obs_dtype, n_actions = spaces
    assert n_actions >= 2
    if job.startswith("breakout_") and "small" not in job:
        # The paper's setting.
        assert (cfg.replay.batch_size, cfg.replay.capacity, cfg.apex.n_step, cfg.comm.n_update) == (512, 65_536, 3, 16)
        assert n == 11 and cfg.topology.actors == 8 and obs_dtype == "uint8"
        assert cfg.replay.architecture in job


@pytest.mark.parametrize("job, key, reads", [
    ("taxi_distql.toml", "run.train_steps=5", "'distql' reads [run] name, seed, out_dir, wall_seconds, env_steps, "
     "target_return, return_window"),
    ("taxi_distql.toml", "replay.alpha=1.0", "'distql' reads [replay] nothing"),
    ("cartpole.toml", "qmix_nothing.x=1", None),
])
def test_a_key_the_algorithm_does_not_read_is_refused_naming_what_it_reads(job, key, reads):
    if reads is None:
        with pytest.raises(ConfigError, match="unknown section"):
            config.load(JOBS / job, [key])
        return
    with pytest.raises(ConfigError) as err:
        config.load(JOBS / job, [key])
    assert err.value.key == key.split("=")[0] and str(err.value).endswith(reads), str(err.value)


@pytest.mark.parametrize("job, old, new", [
    ("cartpole.toml", "agent.n_step", "apex.n_step"),
    ("cartpole.toml", "agent.epsilon", "apex.epsilon"),
    ("cartpole.toml", "agent.epsilon_alpha", "apex.epsilon_alpha"),
    ("predator_prey_qmix.toml", "replay.sampler", "qmix.sampler"),
    ("predator_prey_qmix.toml", "replay.accmer_alpha", "qmix.accmer_alpha"),
    ("predator_prey_qmix.toml", "replay.accmer_discount", "qmix.accmer_discount"),
])
def test_a_key_that_moved_to_its_algorithms_section_is_refused_saying_where(tmp_path, job, old, new):
    value = {"replay.sampler": '"uniform"', "agent.n_step": "5"}.get(old, "0.5")
    with pytest.raises(ConfigError) as err:  # from --set
        config.load(JOBS / job, [f"{old}={value}"])
    assert err.value.key == old and str(err.value).startswith(f"{old}: moved to {new}")
    section, name = old.split(".")
    path = tmp_path / "old.toml"  # from a job file written before the move
    path.write_text((JOBS / job).read_text().replace(f"[{section}]\n", f"[{section}]\n{name} = {value}\n", 1))
    with pytest.raises(ConfigError, match=f"^{old}: moved to {new}"):
        config.load(path)
    cfg, _ = config.load(JOBS / job, [f"{new}={value}"])  # where it lives now
    assert str(getattr(getattr(cfg, new.split(".")[0]), name)) == value.strip('"')


def test_a_checkpoint_that_names_a_moved_key_by_its_old_name_still_resumes():
    from mpirl.job.checkpoint import identity, mismatch
    cfg, _ = config.load(JOBS / "cartpole.toml")
    now = identity(cfg, 4)
    old_name = {new: old for old, new in config.MOVED.items()}
    before = {old_name.get(k, k): v for k, v in now.items()}  # as the code before the move wrote it
    assert "agent.n_step" in before and "apex.n_step" not in before
    assert mismatch(before, now) == ""
    before["agent.n_step"] = repr(5)
    assert mismatch(before, now).startswith("apex.n_step was 5")


@pytest.mark.parametrize("algorithm,normalized", [("impala", True), ("a3c", True), ("apex", False), ("qmix", False),
                                                  ("distql", False)])
def test_what_a_job_does_not_set_is_its_algorithms_default(algorithm, normalized):
    """IMPALA and the gradient family scale rewards unless the job says otherwise; the others have no such
    setting. A job that sets it keeps what it set."""
    stop = {"run": {"wall_seconds": 60.0}}
    cfg = config.from_dict({"agent": {"algorithm": algorithm}, **stop})
    assert cfg.agent.normalize_reward is normalized and config.defaults(algorithm).agent.normalize_reward is normalized
    if normalized:
        cfg = config.from_dict({"agent": {"algorithm": algorithm, "normalize_reward": False}, **stop})
        assert cfg.agent.normalize_reward is False
        assert config.JobConfig().agent.normalize_reward is False  # the shared default is untouched


def test_a_checkpoint_from_before_a_setting_existed_resumes_only_where_the_job_runs_as_it_did():
    """An IMPALA checkpoint written before agent.normalize_reward existed ran without it (the shared default): a
    job that leaves the key at IMPALA's default (on) may not resume it, and is told which key; one that sets it
    off may."""
    from mpirl.job.checkpoint import identity, mismatch
    off, _ = config.load(JOBS / "impala_cartpole.toml")  # the job sets it off
    on = config.from_dict({"agent": {"algorithm": "impala"}, "run": {"train_steps": 10}})
    for cfg, fine in ((off, True), (on, False)):
        before = {k: v for k, v in identity(cfg, 4).items() if k != "agent.normalize_reward"}
        why = mismatch(before, identity(cfg, 4))
        assert why == "" if fine else why.startswith("agent.normalize_reward was unset"), why
