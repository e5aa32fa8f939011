"""Which install provides a multi-agent environment's missing Python package, and the error that names it.

:class:`MarlDependencyError` is a ``ModuleNotFoundError`` whose message names the install: ``pip install
'mpirl[marl]'`` for PettingZoo and mpe2 themselves, PettingZoo's extra of the env's family for that family's
packages (``pettingzoo.atari.*`` needs ``multi_agent_ale_py``: ``pip install 'pettingzoo[atari]'``), read from
the installed distributions' metadata.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re

INSTALL_HINT = "pip install 'mpirl[marl]'"
MARL_EXTRA = ("pettingzoo", "mpe2")  # what mpirl's marl extra installs (setup.cfg), when its metadata is not at hand


class MarlDependencyError(ModuleNotFoundError):
    """A multi-agent env's package is missing; the message says how to install it."""


def _norm(name: str) -> str:
    """A package or module name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "_", name).lower()


def _extras(distribution: str) -> dict[str, set[str]]:
    """``{extra: {normalized names of what it requires}}`` of an installed distribution ({} when it is not)."""
    try:
        requires = importlib.metadata.requires(distribution) or []
    except importlib.metadata.PackageNotFoundError:
        return {}
    out: dict[str, set[str]] = {}
    for req in requires:
        extra = re.search(r"""extra\s*==\s*["']([^"']+)["']""", req)
        name = re.match(r"[A-Za-z0-9._-]+", req)
        if extra and name:
            out.setdefault(extra.group(1), set()).add(_norm(name.group(0)))
    return out


def install_hint(module: str, env_id: str = "") -> str:
    """The install that provides the Python module ``module`` for the env ``env_id``: mpirl's marl extra for
    PettingZoo and mpe2; for a module of a PettingZoo family's own dependencies (``pettingzoo.<family>.<env>``),
    PettingZoo's extra of that family; else the module by its name."""
    top = module.split(".")[0]
    marl = _extras("mpirl").get("marl") or {_norm(m) for m in MARL_EXTRA}
    if _norm(top) in {n.split("[")[0] for n in marl}:
        return INSTALL_HINT
    parts = env_id.split(".")
    if len(parts) >= 3 and parts[0] == "pettingzoo" and parts[1] in _extras("pettingzoo"):
        return f"pip install 'pettingzoo[{parts[1]}]'"
    return f"pip install {top}  (the package that provides the module {top!r})"


def missing_package(env_id: str, module: str) -> MarlDependencyError:
    """The error for ``env_id`` missing the Python module ``module``, naming the install that provides it."""
    return MarlDependencyError(f"{env_id} needs the Python package {module!r}, which is not installed: "
                               f"{install_hint(module, env_id)}", name=module)


def import_for(module: str, what: str):
    """``module`` imported for the env ``what``, or the :class:`MarlDependencyError` naming the install it needs."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise missing_package(what, getattr(err, "name", None) or module) from None
