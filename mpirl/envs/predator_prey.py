"""Stag-hunt predator–prey on a square grid (PyMARL / AccMER / MAC-PO setting) as a PettingZoo ParallelEnv.

The predators ``predator_0 .. predator_{n-1}`` are the agents; the prey belong to the
environment. Everything in :meth:`PredatorPrey.step` is numpy over all agents at once; the
only Python loops are the ones that read and build PettingZoo's per-agent dicts.

Actions (``Discrete(6)``): 0 up, 1 down, 2 left, 3 right, 4 stay, 5 catch. "Up" decreases the
row index. Rows and columns are numbered from the top-left corner.

Legal actions (the action mask, ``infos[agent]["action_mask"]``, :meth:`action_mask`,
:meth:`action_masks`; ``int8``, 1 = legal) are computed from the positions the agent observes:

* stay is always legal;
* a move is legal when its target cell is on the grid and empty (no predator, no prey);
* catch is legal when a live prey is 4-adjacent (manhattan distance 1).

An illegal action (including a sampled action that ignores the mask) acts as ``stay``: it
neither moves, nor catches, nor costs a punishment.

One step, in this order:

1. **Catches**, on the positions at the start of the step. A catching predator targets the
   first prey found in the fixed neighbour order up, down, left, right (the same order as the
   move actions). A prey targeted by >= 2 catchers is captured: the team gets
   ``capture_reward`` once per captured prey, and the prey and *all* predators that targeted it
   leave the grid. Every catcher whose target was not captured (a lone catch) costs the team
   ``punishment`` once.
2. **Predator moves** (one-shot, deterministic given the seed): a move succeeds when its target
   cell is on the grid and empty after the captures of step 1, i.e. a predator cannot follow into
   a cell that another agent leaves in the same step (that cell was occupied at the start). When
   several predators move into the same empty cell, one of them wins, chosen by priorities drawn
   from the env's seeded generator (only when such a conflict exists); the others stay.
3. **Prey moves** (``prey_moves=True``): every live prey picks uniformly among "stay" and its
   empty 4-neighbours (after step 2), using the env's seeded generator; contested cells are
   resolved as in step 2.

Agents that left the grid ("frozen agents", as PyMARL does it): a predator that caught a prey
stays in ``agents`` until the episode ends, so the agent set is fixed for the whole episode.
Its observation is all zeros, its mask allows only ``stay`` (4), its actions do nothing and it
receives the team reward like everyone else.

Episode end: *terminated* when no prey is left or no predator is left on the grid; otherwise
*truncated* after ``max_steps`` steps (never both: a terminal last step is terminated only).
At the end every agent gets its flag and ``agents`` becomes empty (PettingZoo convention).

Rewards are shared: every agent receives the same team reward each step
(``shared_reward = "same"``: count it once, not once per agent).

Observations: ``uint8 (2r+1, 2r+1, 3)`` centred on the agent, values 0/1: channel 0 on-grid
predators (itself included), channel 1 live prey, channel 2 cells outside the grid.

State (:meth:`state`): ``uint8 (grid, grid, 3)``: channel 0 on-grid predators, channel 1 live
prey, channel 2 the *catch zone*: cells 4-adjacent to a live prey (where a predator standing
there could catch).

Counters for test metrics: ``episode_captures``, ``episode_lone_catches``, ``episode_steps``
and ``episode_return`` (team reward, counted once), also as :meth:`episode_stats`.

Hand-placed starts for tests: ``reset(options={"predators": [(row, col) or None, ...],
"prey": [(row, col), ...]})``: exactly ``n_predators`` predator entries (``None`` starts that
predator off the grid, frozen) and at most ``n_prey`` prey (missing prey are absent).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo.utils.env import ParallelEnv

UP, DOWN, LEFT, RIGHT, STAY, CATCH = range(6)
N_ACTIONS = 6
ACTION_NAMES = ("up", "down", "left", "right", "stay", "catch")
_EMPTY, _WALL = -1, -2  # occupancy codes; predators are 0..n-1, prey n..n+m-1
_CODE_SHIFT = 2  # occupancy code + 2 indexes the observation lookup table


class PredatorPrey(ParallelEnv):
    """Stag-hunt predator–prey; see the module docstring for the rules.

    Internally the grid is one flat ``int32`` occupancy array padded by ``max(obs_radius, 1)``
    wall cells on every side, and positions are flat indices into it, so a move, a neighbour
    lookup or an observation window is one addition and one gather for all agents.
    """

    metadata = {"name": "predator_prey_v0", "render_modes": ["ansi", "rgb_array"]}
    shared_reward = "same"
    noop_action = STAY

    def __init__(self, grid: int = 10, n_predators: int = 8, n_prey: int | None = None,
                 punishment: float = 0.0, max_steps: int = 200, capture_reward: float = 10.0,
                 obs_radius: int = 2, prey_moves: bool = True, render_mode: str | None = None):
        n_prey = n_predators if n_prey is None else n_prey
        for name, value, low in (("grid", grid, 2), ("n_predators", n_predators, 2), ("n_prey", n_prey, 1),
                                 ("max_steps", max_steps, 1), ("obs_radius", obs_radius, 0)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if n_predators + n_prey > grid * grid:
            raise ValueError(f"{n_predators} predators and {n_prey} prey do not fit on a {grid}x{grid} grid")
        if not float(punishment) <= 0:
            raise ValueError(f"punishment must be <= 0, got {punishment!r}")
        if render_mode not in (None, "ansi", "rgb_array"):
            raise ValueError(f"render_mode must be None, 'ansi' or 'rgb_array', got {render_mode!r}")
        self.grid, self.n_predators, self.n_prey = int(grid), int(n_predators), int(n_prey)
        self.punishment, self.capture_reward = float(punishment), float(capture_reward)
        self.max_steps, self.obs_radius, self.prey_moves = int(max_steps), int(obs_radius), bool(prey_moves)
        self.render_mode = render_mode

        n, m, g, r = self.n_predators, self.n_prey, self.grid, self.obs_radius
        side = 2 * r + 1
        self.possible_agents = [f"predator_{i}" for i in range(n)]
        self.agents: list[str] = []
        self._index = {a: i for i, a in enumerate(self.possible_agents)}
        self.observation_spaces = {a: spaces.Box(0, 1, (side, side, 3), np.uint8) for a in self.possible_agents}
        self.action_spaces = {a: spaces.Discrete(N_ACTIONS) for a in self.possible_agents}
        self.state_space = spaces.Box(0, 1, (g, g, 3), np.uint8)
        self._rng: np.random.Generator | None = None

        pad = max(r, 1)
        w = g + 2 * pad
        self._pad, self._w = pad, w
        blank = np.full((w, w), _WALL, np.int32)
        blank[pad:pad + g, pad:pad + g] = _EMPTY
        self._occ_blank = blank.ravel()
        self._occ = self._occ_blank.copy()
        # flat offsets: the four neighbours (up, down, left, right), the five moves, the window
        self._nb = np.array([-w, w, -1, 1], np.int64)
        self._moves = np.array([-w, w, -1, 1, 0], np.int64)
        dr, dc = np.meshgrid(np.arange(-r, r + 1), np.arange(-r, r + 1), indexing="ij")
        self._window = (dr * w + dc).ravel().astype(np.int64)
        # occupancy code + 2 -> the three observation channels
        lut = np.zeros((n + m + _CODE_SHIFT, 3), np.uint8)
        lut[_WALL + _CODE_SHIFT, 2] = 1
        lut[_CODE_SHIFT:_CODE_SHIFT + n, 0] = 1
        lut[_CODE_SHIFT + n:, 1] = 1
        self._lut = lut
        self._obs_shape = (n, side, side, 3)

        self._pred = np.zeros(n, np.int64)  # flat positions
        self._pred_on = np.zeros(n, bool)
        self._prey = np.zeros(m, np.int64)
        self._prey_on = np.zeros(m, bool)
        self._pred_ids = np.arange(n, dtype=np.int32)
        self._prey_ids = np.arange(n, n + m, dtype=np.int32)
        self._arange = np.arange(n)
        self._mask = np.zeros((n, N_ACTIONS), np.int8)
        self._off_mask = np.zeros(N_ACTIONS, np.int8)
        self._off_mask[STAY] = 1
        self._n_pred_on = self._n_prey_on = 0
        self._t = 0
        self.episode_captures = self.episode_lone_catches = self.episode_steps = 0
        self.episode_return = 0.0

    # ----- PettingZoo API -----------------------------------------------------------------

    def observation_space(self, agent: str) -> spaces.Box:
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> spaces.Discrete:
        return self.action_spaces[agent]

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None):
        """Start an episode; ``seed`` re-seeds the env's generator (``None`` continues it).

        ``options={"predators": [...], "prey": [...]}`` places the entities by hand (tests);
        other option keys are ignored.
        """
        if seed is not None or self._rng is None:
            self._rng = np.random.default_rng(seed)
        options = options or {}
        if "predators" in options or "prey" in options:
            self._place(options.get("predators"), options.get("prey"))
        else:
            n, g = self.n_predators, self.grid
            cells = self._rng.choice(g * g, n + self.n_prey, replace=False)
            flat = (cells // g + self._pad) * self._w + cells % g + self._pad
            self._pred[:] = flat[:n]
            self._prey[:] = flat[n:]
            self._pred_on[:] = True
            self._prey_on[:] = True
        self._n_pred_on = int(self._pred_on.sum())
        self._n_prey_on = int(self._prey_on.sum())
        occ = self._occ
        occ[:] = self._occ_blank
        occ[self._pred[self._pred_on]] = self._pred_ids[self._pred_on]
        occ[self._prey[self._prey_on]] = self._prey_ids[self._prey_on]
        self._t = 0
        self.episode_captures = self.episode_lone_catches = self.episode_steps = 0
        self.episode_return = 0.0
        self.agents = self.possible_agents[:]
        self._update_masks()
        return dict(zip(self.possible_agents, self._observe())), self._infos()

    def step(self, actions: dict[str, Any]):
        if not self.agents:
            raise RuntimeError("step() called after the episode ended; call reset() first")
        n, occ, pred = self.n_predators, self._occ, self._pred
        act = np.fromiter([actions.get(a, STAY) for a in self.possible_agents], np.int64, n)
        if (act.view(np.uint64) >= N_ACTIONS).any():  # negatives wrap to huge values
            bad = self.possible_agents[int(np.flatnonzero(act.view(np.uint64) >= N_ACTIONS)[0])]
            raise ValueError(f"action {actions[bad]!r} of {bad} is outside 0..{N_ACTIONS - 1}")
        # illegal actions (per the mask the agents observed) act as stay
        act = np.where(self._mask[self._arange, act] != 0, act, STAY)

        # 1. catches, on the positions at the start of the step
        n_cap = n_lone = 0
        catchers = (act == CATCH).nonzero()[0]
        if catchers.size:
            nb = occ[pred[catchers, None] + self._nb]  # (k, 4) codes, neighbour order up, down, left, right
            target = nb[np.arange(catchers.size), (nb >= n).argmax(axis=1)] - n
            counts = np.bincount(target, minlength=self.n_prey)
            caught = counts[target] >= 2
            n_lone = int(catchers.size - np.count_nonzero(caught))
            if n_lone < catchers.size:
                gone_prey = (counts >= 2).nonzero()[0]
                gone_pred = catchers[caught]
                n_cap = int(gone_prey.size)
                self._prey_on[gone_prey] = False
                self._pred_on[gone_pred] = False
                self._n_prey_on -= n_cap
                self._n_pred_on -= gone_pred.size
                occ[self._prey[gone_prey]] = _EMPTY
                occ[pred[gone_pred]] = _EMPTY

        # 2. predator moves (one-shot; a contested cell goes to a random winner)
        movers = (act < STAY).nonzero()[0]
        if movers.size:
            self._move(pred, movers, pred[movers] + self._moves[act[movers]], self._pred_ids[movers])

        # 3. prey moves: uniform over stay + empty neighbours (random keys, the best free option wins)
        if self.prey_moves:
            live = self._prey_on.nonzero()[0]
            if live.size:
                q = self._prey[live]
                keys = self._rng.random((live.size, 5))
                keys[:, :4][occ[q[:, None] + self._nb] != _EMPTY] = -1.0
                choice = keys.argmax(axis=1)
                go = choice != STAY
                if go.any():
                    who = live[go]
                    self._move(self._prey, who, q[go] + self._moves[choice[go]], self._prey_ids[who])

        reward = self.capture_reward * n_cap + self.punishment * n_lone
        self._t += 1
        self.episode_steps = self._t
        if n_cap or n_lone:
            self.episode_captures += n_cap
            self.episode_lone_catches += n_lone
            self.episode_return += reward
        terminated = self._n_prey_on == 0 or self._n_pred_on == 0
        truncated = not terminated and self._t >= self.max_steps

        self._update_masks()
        agents = self.possible_agents
        out = (dict(zip(agents, self._observe())), dict.fromkeys(agents, reward),
               dict.fromkeys(agents, terminated), dict.fromkeys(agents, truncated), self._infos())
        if terminated or truncated:
            self.agents = []
        return out

    def state(self) -> np.ndarray:
        """``uint8 (grid, grid, 3)``: predators on the grid, live prey, catch zone (cells next to a prey)."""
        g, p, w = self.grid, self._pad, self._w
        codes = self._occ.reshape(w, w)
        s = self._lut[codes[p:p + g, p:p + g] + _CODE_SHIFT]  # channels 0, 1 (channel 2 is 0 inside)
        prey = codes >= self.n_predators
        s[:, :, 2] = (prey[p - 1:p - 1 + g, p:p + g] | prey[p + 1:p + 1 + g, p:p + g]
                      | prey[p:p + g, p - 1:p - 1 + g] | prey[p:p + g, p + 1:p + 1 + g])
        return s

    def render(self) -> str | np.ndarray | None:
        if self.render_mode == "rgb_array":
            return self._picture()
        if self.render_mode != "ansi":
            return None
        s = self.state()
        chars = np.where(s[:, :, 0] == 1, "P", np.where(s[:, :, 1] == 1, "o", "."))
        return "\n".join("".join(row) for row in chars)

    def _picture(self, cell: int = 16) -> np.ndarray:
        """The grid as an RGB image, ``cell`` pixels a square: predators red, prey blue, both on one square purple,
        the free squares light grey on a dark grid (even sizes: what video encoders take)."""
        s = self.state()
        colours = np.full((*s.shape[:2], 3), 235, np.uint8)
        colours[s[:, :, 0] == 1] = (220, 40, 40)
        colours[s[:, :, 1] == 1] = (40, 90, 220)
        colours[(s[:, :, 0] == 1) & (s[:, :, 1] == 1)] = (150, 40, 170)
        image = np.repeat(np.repeat(colours, cell, axis=0), cell, axis=1)
        image[::cell, :], image[:, ::cell] = 90, 90
        return image

    def close(self) -> None:
        pass

    # ----- extras for the learner and tests ----------------------------------------------

    def action_mask(self, agent: str) -> np.ndarray:
        """``int8 [6]``, 1 = legal, for the current positions."""
        return self._mask[self._index[agent]].copy()

    def action_masks(self) -> np.ndarray:
        """``int8 [n_predators, 6]`` in ``possible_agents`` order."""
        return self._mask.copy()

    def episode_stats(self) -> dict[str, float | int]:
        """This episode so far: captures, lone catches, steps and the team return (counted once)."""
        return {"captures": self.episode_captures, "lone_catches": self.episode_lone_catches,
                "steps": self.episode_steps, "return": self.episode_return}

    @property
    def predator_positions(self) -> np.ndarray:
        """``int [n, 2]`` (row, col) on the grid; ``-1`` rows for predators that left."""
        return self._rowcol(self._pred, self._pred_on)

    @property
    def prey_positions(self) -> np.ndarray:
        """``int [n_prey, 2]`` (row, col); ``-1`` rows for captured or absent prey."""
        return self._rowcol(self._prey, self._prey_on)

    # ----- internals ----------------------------------------------------------------------

    def _rowcol(self, flat: np.ndarray, on: np.ndarray) -> np.ndarray:
        rc = np.stack(np.divmod(flat, self._w), axis=1) - self._pad
        return np.where(on[:, None], rc, -1)

    def _move(self, pos: np.ndarray, idx: np.ndarray, target: np.ndarray, ids: np.ndarray) -> None:
        """Move entities ``idx`` of ``pos`` to flat cells ``target`` that are empty; one winner per cell.

        Contested cells: the mover with the lowest priority drawn from the env's generator wins
        (numbers are drawn only when a contest exists, so runs stay reproducible per seed).
        """
        occ = self._occ
        ok = occ[target] == _EMPTY
        if not ok.all():
            idx, target, ids = idx[ok], target[ok], ids[ok]
            if not idx.size:
                return
        occ[target] = ids
        if idx.size > 1 and not (occ[target] == ids).all():
            order = np.lexsort((self._rng.random(idx.size), target))
            first = np.ones(idx.size, bool)
            first[1:] = target[order[1:]] != target[order[:-1]]
            keep = order[first]
            idx, target, ids = idx[keep], target[keep], ids[keep]
            occ[target] = ids
        occ[pos[idx]] = _EMPTY
        pos[idx] = target

    def _update_masks(self) -> None:
        n = self.n_predators
        nb = self._occ[self._pred[:, None] + self._nb]  # (n, 4); stale rows for predators off the grid
        m = self._mask
        m[:, :4] = nb == _EMPTY
        m[:, CATCH] = (nb >= n).any(axis=1)
        m[:, STAY] = 1
        if self._n_pred_on < n:
            m[~self._pred_on] = self._off_mask

    def _observe(self) -> np.ndarray:
        codes = self._occ[self._pred[:, None] + self._window]  # (n, side*side)
        obs = self._lut[codes + _CODE_SHIFT].reshape(self._obs_shape)
        if self._n_pred_on < self.n_predators:
            obs[~self._pred_on] = 0
        return obs

    def _infos(self) -> dict[str, dict[str, np.ndarray]]:
        mask = self._mask.copy()
        return {a: {"action_mask": row} for a, row in zip(self.possible_agents, mask)}

    def _place(self, predators, prey) -> None:
        g, n, m, p, w = self.grid, self.n_predators, self.n_prey, self._pad, self._w
        predators = list(predators) if predators is not None else None
        prey = list(prey) if prey is not None else []
        if predators is None or len(predators) != n:
            raise ValueError(f"options['predators'] must list {n} positions (row, col) or None")
        if len(prey) > m:
            raise ValueError(f"options['prey'] lists {len(prey)} prey; this env has n_prey={m}")
        seen: set[tuple[int, int]] = set()
        for what, cells in (("predator", predators), ("prey", prey)):
            for cell in cells:
                if cell is None and what == "predator":
                    continue
                r, c = (int(v) for v in cell)
                if not (0 <= r < g and 0 <= c < g):
                    raise ValueError(f"{what} position {(r, c)} is off the {g}x{g} grid")
                if (r, c) in seen:
                    raise ValueError(f"two entities placed on cell {(r, c)}")
                seen.add((r, c))
        flat = lambda cell: (int(cell[0]) + p) * w + int(cell[1]) + p  # noqa: E731
        self._pred_on[:] = [cell is not None for cell in predators]
        self._pred[:] = [flat(cell) if cell is not None else flat((0, 0)) for cell in predators]
        self._prey_on[:] = False
        self._prey[:] = flat((0, 0))
        self._prey[:len(prey)] = [flat(cell) for cell in prey]
        self._prey_on[:len(prey)] = True
