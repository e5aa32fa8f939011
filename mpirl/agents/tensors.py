"""Where a network runs and how a batch gets there: the device and precision ``agent.device`` / ``agent.precision``
name, and numpy batches as tensors on it (frames once: one gather on the device). Every learner and worker uses
them, whatever its algorithm."""

from __future__ import annotations

import numpy as np
import torch


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` runs bfloat16 matrix products natively (AMX / AVX-512 BF16 CPUs, GPUs)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    probes = [getattr(torch.cpu, name, None) for name in ("_is_amx_tile_supported", "_is_avx512_bf16_supported")]
    return any(p() for p in probes if p is not None)


def pick_precision(name: str, device: torch.device) -> str:
    if name == "auto":
        return "bf16" if native_bf16(device) else "fp32"
    return name


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def floats(t: torch.Tensor) -> torch.Tensor:
    """``t`` as the networks' floats: torch's default floating dtype, which their parameters are made in (float32,
    unless a caller set another before building them: ``tests/learners_job.py`` runs the learners in float64, where
    K learners and one agree to the last bits that float32's rounding, amplified at a ReLU's kink, does not keep).
    A tensor of that dtype already is returned as it is, as ``.float()`` does."""
    return t.to(torch.get_default_dtype())


def to_tensors(batch: dict[str, np.ndarray], device: torch.device) -> dict[str, torch.Tensor]:
    """Numpy views -> tensors on ``device`` (zero-copy on the CPU).

    Frames once: ``frames`` (F, *frame_shape) with ``<name>_idx`` (n, depth) becomes ``<name>``
    (n, depth, *frame_shape), one gather on ``device``: only the distinct frames cross to it."""
    out = {k: torch.as_tensor(v, device=device) for k, v in batch.items() if k != "frames" and not k.endswith("_idx")}
    if "frames" in batch:
        frames = torch.as_tensor(batch["frames"], device=device)
        rows = frames.flatten(1)  # one row a frame: index_select copies rows 3x faster than 84x84 planes
        for k, v in batch.items():
            if k.endswith("_idx"):
                idx = torch.as_tensor(v, device=device).long()
                out[k[:-4]] = rows.index_select(0, idx.reshape(-1)).view(*idx.shape, *frames.shape[1:])
    return out


def as_tensors(tree: dict) -> dict:
    """numpy arrays in a nested dict as tensors (a checkpoint loads with ``weights_only``: tensors, not arrays)."""
    return {k: as_tensors(v) if isinstance(v, dict) else torch.as_tensor(v) if isinstance(v, np.ndarray) else v
            for k, v in tree.items()}


def as_arrays(tree: dict) -> dict:
    """:func:`as_tensors` undone."""
    return {k: as_arrays(v) if isinstance(v, dict) else v.cpu().numpy() if isinstance(v, torch.Tensor) else v
            for k, v in tree.items()}
