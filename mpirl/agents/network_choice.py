"""Which Q-network takes a job's observations (``agent.network``): the choice alone, without torch, so the checks and
an actor that acts in numpy (:mod:`mpirl.agents.acting`) can make it; the networks are in :mod:`mpirl.agents.networks`."""

from __future__ import annotations

NATURE_MIN_SIDE = 36  # the Nature convolutions (8/4, 4/2, 3/1) need 36x36 or more
NETWORKS = ("mlp", "minatar", "nature")


def network_for(obs_shape: tuple[int, ...], choice: str = "auto") -> str:
    """Which network takes observations of ``obs_shape``: ``choice`` itself, or for "auto" the MLP for
    vectors, MinAtar's for images under 36x36, Nature's from there. ValueError, saying why, for a shape the
    network cannot take."""
    if choice != "auto" and choice not in NETWORKS:
        raise ValueError(f"no network named {choice!r}; choose one of auto, {', '.join(NETWORKS)}")
    if choice == "auto":
        if len(obs_shape) == 1:
            return "mlp"
        if len(obs_shape) != 3:
            raise ValueError(f"no network takes observations of shape {tuple(obs_shape)} on its own: vectors "
                             f"and (C, H, W) images have one; agent.network = \"mlp\" flattens any shape")
        return "nature" if min(obs_shape[1:]) >= NATURE_MIN_SIDE else "minatar"
    if choice != "mlp" and len(obs_shape) != 3:
        raise ValueError(f"the {choice} network takes (C, H, W) images, not observations of shape "
                         f"{tuple(obs_shape)}; agent.network = \"mlp\" or \"auto\" takes them")
    if choice == "minatar" and min(obs_shape[1:]) < 3:
        raise ValueError(f"the minatar network's 3x3 convolution needs images of 3x3 or more, not {tuple(obs_shape)}")
    if choice == "nature" and min(obs_shape[1:]) < NATURE_MIN_SIDE:
        raise ValueError(f"the nature network needs images of {NATURE_MIN_SIDE}x{NATURE_MIN_SIDE} or more, "
                         f"not {tuple(obs_shape)}; agent.network = \"minatar\" (or \"auto\") is made for small ones")
    return choice
