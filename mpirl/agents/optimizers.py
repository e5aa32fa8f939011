"""The optimizers the learners step, built in one place.

:func:`adam` is ``torch.optim.Adam`` with torch's fused kernel where the parameters' device has one (the CPU and
CUDA): one pass over every parameter instead of a dozen small operations on each, which on the CPU is most of an
optimizer step for the small networks reinforcement learning trains (on one thread here: 334 against 105 us a step
for the MuJoCo jobs' two [256, 256] networks, 200 against 52 us for CartPole's two [64, 64]). The update is Adam's,
equal to the loop's up to floating-point rounding (tested).
"""

from __future__ import annotations

import inspect
import sys
from typing import Iterable

import torch
import torch.optim

FUSED_DEVICES = ("cpu", "cuda")
DYNAMO_MARK = "__dynamo_disable"  # where torch's _disable_dynamo keeps the wrapper it makes on a function's first call


def eager_only() -> int:
    """Mark torch's optimizers "never compiled" without importing torch._dynamo; returns the functions marked.

    torch keeps ``torch.compile`` out of its optimizers with a decorator (``torch._disable_dynamo``) that imports
    ``torch._dynamo`` on the first call of any of them: ``Optimizer.__init__``'s ``add_param_group``, ``step``'s
    ``adam``/``rmsprop``, ``zero_grad``, ``state_dict``. That import costs 2.0-2.2 CPU-s here (measured: ``import
    torch._dynamo`` after ``import torch``), in every rank that trains (learners, the gradient workers and their
    server), once per process: 8-10 CPU-s of a five-rank a3c job's start-up on two cores. The decorator caches the
    wrapper it makes on the function (``fn.__dynamo_disable``) and calls that from then on; outside a compiled
    region the wrapper only runs ``fn``. mpirl never compiles (no ``torch.compile``, no ``torch._dynamo``), so the
    cache is filled ahead with ``fn`` itself, and the calls are what they are in eager mode. Should torch rename the
    mark, nothing is filled and the decorator imports dynamo as before: slower, never wrong."""
    try:
        from torch._compile import _disable_dynamo
        decorated = _disable_dynamo(lambda: None).__code__  # the code of every function the decorator makes
    except (ImportError, AttributeError):
        return 0
    marked = 0
    seen: set[int] = set()
    todo = []
    for name, module in list(sys.modules.items()):
        if module is not None and (name == "torch.optim" or name.startswith("torch.optim.")):
            for value in vars(module).values():
                is_optimizer = inspect.isclass(value) and issubclass(value, torch.optim.Optimizer)
                todo += list(vars(value).values()) if is_optimizer else [value]
    while todo:  # functions, what they wrap, and the functions their closures hold (step's functional adam)
        f = todo.pop()
        if not callable(f) or id(f) in seen or not hasattr(f, "__code__"):
            continue
        seen.add(id(f))
        inner = getattr(f, "__wrapped__", None)
        if f.__code__ is decorated and inner is not None and not hasattr(inner, DYNAMO_MARK):
            setattr(inner, DYNAMO_MARK, inner)
            marked += 1
        todo += [inner] if inner is not None else []
        for cell in f.__closure__ or ():
            try:
                todo.append(cell.cell_contents)
            except ValueError:  # an empty cell
                pass
    return marked


_marked: list[int] = []  # eager_only()'s count, once a process built one of the optimizers below


def _eager_step(cls: type) -> object | None:
    """``cls.step`` without the wrappers around it (``_use_grad_for_differentiable``'s, which imports torch._dynamo
    on every call for a graph break, and the hooks' one an instance adds): the function written as ``step``, or None
    where torch is not built that way."""
    f = vars(cls).get("step")
    while f is not None and getattr(getattr(f, "__code__", None), "co_name", None) != "step":
        f = getattr(f, "__wrapped__", None)
    return f


class _EagerStep:
    """An optimizer whose ``step`` is torch's own update without the wrapper that imports ``torch._dynamo`` (see
    :func:`eager_only`): in eager mode that wrapper only turns gradients off around the step (``differentiable``
    False, as every optimizer here is) and marks two graph breaks, which mean nothing outside a compiled region. The
    hooks and the profiler's record of each step stay (the instance's own wrapper of this ``step``)."""

    _step = staticmethod(None)  # the update written as step, or None (then the wrapped one)

    def __init__(self, *args, **kwargs):
        # Only a process that trains here marks torch's optimizers (one that loads a policy to play, or a user's
        # own code importing mpirl, keeps torch's decorators as they are).
        if not _marked:
            _marked.append(eager_only())
        super().__init__(*args, **kwargs)

    def step(self, closure=None):
        if self._step is None or self.defaults.get("differentiable"):
            return super().step(closure)  # type: ignore[misc]
        with torch.no_grad():
            return self._step(self, closure)  # type: ignore[misc]


class Adam(_EagerStep, torch.optim.Adam):
    """``torch.optim.Adam``, its update torch's, started without torch._dynamo (:class:`_EagerStep`)."""

    _step = staticmethod(_eager_step(torch.optim.Adam))


class RMSprop(_EagerStep, torch.optim.RMSprop):
    """``torch.optim.RMSprop``, its update torch's, started without torch._dynamo (:class:`_EagerStep`)."""

    _step = staticmethod(_eager_step(torch.optim.RMSprop))


def adam(params: Iterable[torch.nn.Parameter], lr: float, eps: float) -> Adam:
    """Adam over ``params``: fused where every parameter is a float on a device of :data:`FUSED_DEVICES`."""
    params = list(params)
    fused = bool(params) and all(p.device.type in FUSED_DEVICES and p.dtype.is_floating_point for p in params)
    return Adam(params, lr=lr, eps=eps, fused=fused or None)


def rmsprop(params: Iterable[torch.nn.Parameter], lr: float, alpha: float, eps: float) -> RMSprop:
    """RMSProp (torch has no fused kernel for it): ``foreach`` on every device, one call per operation over all the
    parameters rather than a Python loop over them."""
    return RMSprop(list(params), lr=lr, alpha=alpha, eps=eps, foreach=True)
