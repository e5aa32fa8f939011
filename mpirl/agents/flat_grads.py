"""A network's gradient as one flat float32 vector: what crosses the network when gradients are shared (the a3c
workers' to a server or in an allreduce, the several replay learners' sum). :func:`flat_grad` writes the parameters'
``.grad`` concatenated in ``parameters()`` order; :func:`set_flat_grad` writes such a vector back before the
optimizer steps. :func:`flat_values` writes the parameters themselves the same way. :func:`flat_norm` and
:func:`clip_scale` clip such a vector by its norm as ``torch.nn.utils.clip_grad_norm_`` does, in the pass that copies
it into the parameters rather than in one pass more over them.
"""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np
import torch
from torch import Tensor


WIRE_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))  # float32 on every wire; float64 where the networks are


def wire_dtype(params: Iterable[Tensor]) -> np.dtype:
    """The flat vector's dtype for ``params``: float32, or float64 when they are (a network run in float64)."""
    return np.dtype(np.float64) if any(p.dtype == torch.float64 for p in params) else np.dtype(np.float32)


def flat_grad(params: Iterable[Tensor], out: np.ndarray) -> None:
    """Write the parameters' ``.grad``, concatenated in order, into ``out`` (float32, one value per parameter
    element; zeros for a parameter without a gradient; float64 for parameters in float64, as a test runs them)."""
    params = list(params)
    _flatten(params, [p.grad for p in params], out, "the gradient has")


def flat_values(params: Iterable[Tensor], out: np.ndarray) -> None:
    """Write the parameters' values, concatenated in order, into ``out`` (float32): what a server sends straight
    into a reply's buffer, without a vector of its own in between."""
    params = list(params)
    _flatten(params, params, out, "the parameters have")


def _flatten(params: list[Tensor], tensors: list, out: np.ndarray, what: str) -> None:
    n = sum(p.numel() for p in params)
    if out.ndim != 1 or out.shape[0] != n:
        raise ValueError(f"{what} {n} values but out has {out.size} (shape {out.shape})")
    if out.dtype not in WIRE_DTYPES:
        raise ValueError(f"out must be float32 (or float64), not {out.dtype}")
    flat = torch.from_numpy(out)
    offset = 0
    for p, t in zip(params, tensors):
        part = flat[offset:offset + p.numel()]
        if t is None:
            part.zero_()
        else:
            part.copy_(t.detach().reshape(-1))  # to float32 on the CPU
        offset += p.numel()


def set_flat_grad(params: Iterable[Tensor], flat: np.ndarray, scale: float = 1.0) -> None:
    """Set each parameter's ``.grad`` (on its device, in its dtype) from the flat vector :func:`flat_grad` writes,
    times ``scale`` (an allreduce's sum into a mean, in the same pass as the copy); the gradients are copies, not
    views of ``flat``."""
    params = list(params)
    n = sum(p.numel() for p in params)
    if flat.ndim != 1 or flat.shape[0] != n:
        raise ValueError(f"the parameters have {n} values but the flat gradient has {flat.size} "
                         f"(shape {flat.shape})")
    host = np.ascontiguousarray(flat, dtype=flat.dtype if flat.dtype in WIRE_DTYPES else np.float32)
    src = torch.from_numpy(host if host.flags.writeable else host.copy())
    offset = 0
    for p in params:
        part = src[offset:offset + p.numel()].view_as(p)
        if p.grad is not None and p.grad.shape == p.shape and p.grad.dtype == p.dtype and p.grad.device == p.device:
            if scale == 1.0:
                p.grad.copy_(part)
            else:
                torch.mul(part.to(p.device), scale, out=p.grad)
        else:
            p.grad = part.to(device=p.device, dtype=p.dtype, copy=True)
            if scale != 1.0:
                p.grad.mul_(scale)
        offset += p.numel()


def flat_norm(flat: np.ndarray) -> float:
    """The Euclidean norm of a flat float32 vector (a gradient; float32 throughout, as torch's norm of float32
    gradients): inf or nan when a value is."""
    v = np.asarray(flat, dtype=np.float32)
    return math.sqrt(float(np.dot(v, v)))


def clip_scale(norm: float, max_norm: float) -> float:
    """The factor that brings a gradient of ``norm`` to at most ``max_norm``, as ``torch.nn.utils.clip_grad_norm_``
    computes it (``max_norm / (norm + 1e-6)``, at most 1); nan when ``norm`` is not finite, as torch's leaves the
    gradient."""
    if not math.isfinite(norm):
        return math.nan
    return min(1.0, max_norm / (norm + 1e-6))
