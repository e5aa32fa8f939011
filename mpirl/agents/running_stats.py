"""Running mean and variance of observations and of discounted returns, merged across ranks: what SB3's
``VecNormalize`` keeps for one process, kept here for a whole job.

A rank that plays counts what it saw as **moments** (:class:`Moments`: the count, the sum and the sum of squares of
``x - shift``, per observation number), which add: the sum of several ranks' moments is the moments of all their
data together, so an MPI sum (an allreduce, or a server adding what each worker sent) merges them exactly. Whoever
holds the job's statistics (:class:`RunningStats`: count, mean, variance in float64) folds moments in with Chan et
al.'s parallel update (1979), which equals one pass over all the data. The moments travel as float32 (inside a
gradient vector), so they are taken about a ``shift`` every rank knows without a message -- for observations, the
job's reference observation (the first one of a game seeded 0) -- rather than about 0: sums of squares about 0 of
values far from 0 (an observation near 100 with spread 0.1) would lose the variance to float32's rounding. The
statistics themselves stay float64 where they are kept and travel as float32 only to be used.

:class:`Normalization` is the pair a policy uses: observations ``clip((x - mean) / sqrt(var + eps), -c, c)`` and
rewards divided by the standard deviation of each game's discounted return ``R_t = gamma R_{t-1} + r_t`` (reset where
an episode ends), then clipped -- SB3's ``VecNormalize(norm_obs, norm_reward)`` with its defaults (eps 1e-8, clips
10). ``shift``: the observations' reference (every rank the same). **Images** (``uint8`` pixels) are first scaled by
1/255 as the networks scale them (:data:`PIXEL_SCALE`), then normalised pixel by pixel: Sample Factory's
``normalize_input`` on Atari, where the background's pixels go to 0 and the few that move (the ball, the paddles)
stand out; the statistics are those of the scaled pixels. No MPI, no torch.
"""

from __future__ import annotations

import numpy as np

EPS = 1e-8
PIXEL_SCALE = 1.0 / 255.0  # uint8 pixels as the networks take them (mpirl.agents.networks.image_floats)


def input_scale(obs_dtype) -> float:
    """What an observation of ``obs_dtype`` is multiplied by before it is normalised: 1/255 for ``uint8`` images (as
    the networks scale them), 1 for anything else."""
    return PIXEL_SCALE if obs_dtype is not None and np.dtype(obs_dtype) == np.uint8 else 1.0


class Moments:
    """Count, sum and sum of squares of the rows of ``shape`` (less ``shift``) seen since the last :meth:`take`."""

    def __init__(self, shape: tuple, shift: np.ndarray | None = None):
        self.shape = tuple(shape)
        self.size = int(np.prod(shape)) if shape else 1
        self.shifted = shift is not None
        self.shift = np.zeros(self.size) if shift is None else np.asarray(shift, np.float64).reshape(self.size)
        self.values = np.zeros(1 + 2 * self.size)  # float64 while counting

    def add(self, x: np.ndarray) -> None:
        """Count the rows of ``x`` (``[..., *shape]``): float64 ones, or float32 ones about 0 (pixels in [0, 1])
        summed in float64, read where they lie (a strided view of a batch is not copied)."""
        x = np.asarray(x)
        if x.dtype == np.float32 and not self.shifted and x.ndim > len(self.shape):
            lead = tuple(range(x.ndim - len(self.shape)))
            self.values[0] += int(np.prod([x.shape[i] for i in lead]))
            self.values[1:1 + self.size] += x.sum(lead, dtype=np.float64).reshape(-1)
            self.values[1 + self.size:] += np.square(x).sum(lead, dtype=np.float64).reshape(-1)
            return
        x = x.reshape(-1, self.size)
        if x.dtype != np.float32 or self.shifted:
            x = x.astype(np.float64) - self.shift
        self.values[0] += len(x)
        self.values[1:1 + self.size] += x.sum(0, dtype=np.float64)
        self.values[1 + self.size:] += np.square(x).sum(0, dtype=np.float64)

    def take(self, out: np.ndarray) -> None:
        """Write the moments into ``out`` (``1 + 2 size`` values) and start counting afresh."""
        out[:] = self.values
        self.values[:] = 0.0

    @property
    def nbytes_f32(self) -> int:
        return 4 * len(self.values)


class RunningStats:
    """Count, mean and variance (population) of everything folded in so far, float64."""

    def __init__(self, shape: tuple):
        self.shape = tuple(shape)
        self.size = int(np.prod(shape)) if shape else 1
        self.count = 0.0
        self.mean = np.zeros(self.size)
        self.var = np.ones(self.size)  # before any data: the identity normalisation
        self.changes = 0  # how often mean and var were replaced (what a copy of them derived checks)

    @property
    def n_values(self) -> int:
        """Values in :meth:`flat`: the count, the means, the variances."""
        return 1 + 2 * self.size

    def fold(self, moments: np.ndarray, shift: np.ndarray | float = 0.0) -> None:
        """Chan's parallel update with the data ``moments`` (count, sums, sums of squares about ``shift``) describe."""
        m = np.asarray(moments, np.float64)
        n = float(m[0])
        if n <= 0:
            return
        centred = m[1:1 + self.size] / n
        mean_b = centred + shift
        m2_b = np.maximum(m[1 + self.size:] - n * np.square(centred), 0.0)
        total = self.count + n
        delta = mean_b - self.mean
        m2 = self.var * self.count + m2_b + np.square(delta) * self.count * n / total
        self.mean = self.mean + delta * n / total
        self.var = m2 / total
        self.count = total
        self.changes += 1

    def flat(self, out: np.ndarray | None = None) -> np.ndarray:
        out = np.empty(self.n_values) if out is None else out
        out[0], out[1:1 + self.size], out[1 + self.size:] = self.count, self.mean, self.var
        return out

    def load(self, flat: np.ndarray) -> None:
        flat = np.asarray(flat, np.float64)
        self.count = float(flat[0])
        self.mean = flat[1:1 + self.size].copy()
        self.var = flat[1 + self.size:1 + 2 * self.size].copy()
        self.changes += 1

    def state(self) -> dict:
        return {"count": self.count, "mean": self.mean.copy(), "var": self.var.copy()}

    def restore(self, st: dict) -> None:
        self.count, self.mean, self.var = float(st["count"]), np.array(st["mean"], np.float64), np.array(st["var"],
                                                                                                         np.float64)
        self.changes += 1


class Normalization:
    """A job's observation and return statistics (either may be off), what a playing rank counts for them, and the
    normalisation of its observations and rewards. ``gamma``: the discount of the returns whose spread scales the
    rewards."""

    def __init__(self, obs_shape: tuple, obs: bool, reward: bool, gamma: float, obs_clip: float = 10.0,
                 reward_clip: float = 10.0, shift: np.ndarray | None = None, obs_scale: float = 1.0):
        self.on_obs, self.on_reward = obs, reward
        self.gamma, self.obs_clip, self.reward_clip = gamma, obs_clip, reward_clip
        self.obs_shape = tuple(obs_shape)
        self.obs_scale = float(obs_scale)  # raw observations x this are what the statistics describe (1/255: pixels)
        self.obs = RunningStats(obs_shape) if obs else None
        self.ret = RunningStats(()) if reward else None
        if shift is not None:
            shift = np.asarray(shift, np.float64) * self.obs_scale
        self.obs_moments = Moments(obs_shape, shift) if obs else None
        self.ret_moments = Moments(()) if reward else None
        self.returns: np.ndarray | None = None  # each game's discounted return so far (reward scaling)
        self._pixels: tuple[int, np.ndarray, np.ndarray] | None = None  # (changes, mean, 1 / sd) as float32

    @property
    def on(self) -> bool:
        return self.on_obs or self.on_reward

    # -- the statistics' flat form: what travels with the parameters, and what travels with a gradient
    @property
    def n_stats(self) -> int:
        return sum(s.n_values for s in (self.obs, self.ret) if s is not None)

    @property
    def n_moments(self) -> int:
        return sum(len(m.values) for m in (self.obs_moments, self.ret_moments) if m is not None)

    def _parts(self, moments: bool):
        """``(statistics, moments, slice)`` of the observations' and the returns' parts of the flat form (either
        part absent when off): the statistics' flat form and the moments' have the same layout."""
        i = 0
        for s, m in ((self.obs, self.obs_moments), (self.ret, self.ret_moments)):
            if s is not None and m is not None:
                n = len(m.values) if moments else s.n_values
                yield s, m, slice(i, i + n)
                i += n

    def stats_flat(self, out: np.ndarray) -> None:
        for s, _, part in self._parts(moments=False):
            s.flat(out[part])

    def load_stats(self, flat: np.ndarray) -> None:
        for s, _, part in self._parts(moments=False):
            s.load(flat[part])

    def take_moments(self, out: np.ndarray) -> None:
        """What this rank counted since the last call, into ``out`` (``n_moments`` values)."""
        for _, m, part in self._parts(moments=True):
            m.take(out[part])

    def fold(self, moments: np.ndarray) -> None:
        """Merge moments (one rank's, or several ranks' summed) into the statistics."""
        for s, m, part in self._parts(moments=True):
            s.fold(moments[part], m.shift)

    # -- playing
    def observe(self, obs: np.ndarray) -> np.ndarray:
        """Count raw observations ``[k, *obs_shape]`` and return them normalised (float32); as they are when off."""
        if self.obs is None or self.obs_moments is None:
            return obs
        x = self.scaled(obs)
        self.obs_moments.add(x)
        return self._normalized(x, np.shape(obs))

    def scaled(self, obs: np.ndarray) -> np.ndarray:
        """Raw observations as the statistics describe them: float64, or pixels x 1/255 in float32 (values in [0, 1],
        whose rounding, 6e-8, is far below any moving pixel's spread; several times faster on 28,224 pixels)."""
        if self.obs_scale == 1.0:
            return np.asarray(obs, np.float64)
        return np.multiply(obs, np.float32(self.obs_scale), dtype=np.float32)

    def normalize(self, obs: np.ndarray, scaled: bool = False) -> np.ndarray:
        """Observations normalised with the statistics as they are (not counted): final observations, test games.
        ``scaled``: ``obs`` came from :meth:`scaled` (a learner that counted them first); pixels are then
        normalised in place."""
        if self.obs is None:
            return obs
        return self._normalized(obs if scaled else self.scaled(obs), np.shape(obs))

    def _normalized(self, x: np.ndarray, shape: tuple) -> np.ndarray:
        assert self.obs is not None
        x = x.reshape(shape[0], -1)
        if x.dtype == np.float32:  # pixels: float32 mean and 1 / sd, made again when the statistics change
            s = self.obs
            if self._pixels is None or self._pixels[0] != s.changes:
                inv_sd = (1.0 / np.sqrt(s.var + EPS)).astype(np.float32)
                self._pixels = (s.changes, s.mean.astype(np.float32), inv_sd)
            z = np.subtract(x, self._pixels[1], out=x)  # x is this call's own (from :meth:`scaled`)
            z *= self._pixels[2]
            return np.clip(z, -self.obs_clip, self.obs_clip, out=z).reshape(shape)
        z = (x - self.obs.mean) / np.sqrt(self.obs.var + EPS)
        return np.clip(z, -self.obs_clip, self.obs_clip).astype(np.float32).reshape(shape)

    def count(self, obs: np.ndarray | None = None, returns: np.ndarray | None = None, scaled: bool = False) -> None:
        """Count raw observations and discounted returns seen elsewhere (a learner counting its batches); folded by
        :meth:`fold_counted`. ``scaled``: ``obs`` came from :meth:`scaled` (counted as they are)."""
        if obs is not None and self.obs_moments is not None:
            self.obs_moments.add(obs if scaled else self.scaled(obs))
        if returns is not None and self.ret_moments is not None:
            self.ret_moments.add(np.asarray(returns).reshape(-1))

    def fold_counted(self) -> None:
        """What :meth:`count` (or :meth:`observe`, :meth:`rewards`) counted, folded into the statistics here."""
        out = np.zeros(self.n_moments)
        self.take_moments(out)
        self.fold(out)

    def scale(self, reward: np.ndarray) -> np.ndarray:
        """Rewards divided by the discounted return's standard deviation and clipped (not counted)."""
        if self.ret is None:
            return reward
        scaled = np.asarray(reward, np.float64) / np.sqrt(self.ret.var[0] + EPS)
        return np.clip(scaled, -self.reward_clip, self.reward_clip).astype(np.float32)

    def discounted(self, reward: np.ndarray, ended: np.ndarray) -> np.ndarray:
        """Each game's discounted return after ``reward`` (``[k]``), restarted after the games in ``ended``."""
        if self.returns is None:
            self.returns = np.zeros(len(reward))
        self.returns = self.returns * self.gamma + reward
        out = self.returns.copy()
        self.returns[np.asarray(ended, bool)] = 0.0
        return out

    def restart(self) -> None:
        """Every game's discounted return begins again at zero (the games were rebuilt: no episode goes on)."""
        self.returns = None

    def rewards(self, reward: np.ndarray, ended: np.ndarray) -> np.ndarray:
        """Rewards ``[k]`` as the loss takes them: divided by the spread of the discounted return (counted here) and
        clipped; as they are when off. ``ended``: the games whose episode ended with this reward."""
        if self.ret is None or self.ret_moments is None:
            return reward
        self.ret_moments.add(self.discounted(reward, ended))
        return self.scale(reward)

    def state(self) -> dict:
        return {name: s.state() for name, s in (("obs", self.obs), ("ret", self.ret)) if s is not None}

    def restore(self, st: dict) -> None:
        for name, s in (("obs", self.obs), ("ret", self.ret)):
            if s is not None and name in st:
                s.restore(st[name])


def needs_shift(agent_cfg, obs_dtype) -> bool:
    """Whether the job's observation statistics want the observations' reference (:func:`normalization`'s
    ``obs_shift``): normalised observations that are not images."""
    return bool(agent_cfg.normalize_obs) and input_scale(obs_dtype) == 1.0


def normalization(obs_shape: tuple, agent_cfg, obs_shift: np.ndarray | None = None, obs_dtype=None
                  ) -> Normalization:
    """The statistics ``[agent]`` asks for (none by default); ``obs_shift``: the observations' reference, the same on
    every rank (:func:`mpirl.envs.factory.reference_observation`), where moments are counted to travel, in raw units;
    ``obs_dtype``: the observations' (``uint8`` images are scaled by 1/255 first, :func:`input_scale`, and need no
    shift: pixels in [0, 1] keep their variance in float32 sums about 0)."""
    a = agent_cfg
    scale = input_scale(obs_dtype)
    return Normalization(obs_shape, a.normalize_obs, a.normalize_reward, a.gamma, a.normalized_obs_clip,
                         a.normalized_reward_clip, obs_shift if scale == 1.0 else None, scale)
