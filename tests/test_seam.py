"""The algorithm seam: every folder of mpirl/algos/ offers the same interface, the shared wiring never names an
algorithm, and a job imports only its own algorithm (the shared wiring imports no torch)."""

from __future__ import annotations

import dataclasses
import importlib
import re
import subprocess
import sys
import typing
from pathlib import Path

import numpy as np
import pytest

from mpirl import config

PKG = Path(config.__file__).resolve().parent


@pytest.mark.parametrize("name", config.ALGORITHMS)
def test_every_algorithm_offers_the_interface(name):
    settings = importlib.import_module(f"mpirl.algos.{name}.settings")
    assert isinstance(settings.SECTIONS, dict) and callable(settings.check)
    for section, keys in settings.USES.items():  # every key it claims to read exists in that shared section
        fields = {f.name for f in dataclasses.fields(config.SHARED[section])}
        assert set(keys) <= fields, (name, section, set(keys) - fields)
    algo = importlib.import_module(f"mpirl.algos.{name}.algorithm")
    assert callable(settings.world_size)
    for attr in ("check", "layout", "build_topology", "rank_files", "role_map", "describe", "summary"):
        assert callable(getattr(algo, attr)), (name, attr)
    assert set(algo.ROLES) and all(callable(loop) for loop in algo.ROLES.values())
    info = importlib.import_module(f"mpirl.algos.{name}.info")
    assert callable(info.summarize) and callable(info.format_summary) and callable(info.frame)
    for key, value in settings.DEFAULTS.items():  # its own defaults: of shared keys it reads, inside their domains
        section, field = key.split(".", 1)
        dom = next(f.metadata["domain"] for f in dataclasses.fields(config.SHARED[section]) if f.name == field)
        kind = typing.get_type_hints(config.SHARED[section])[field]
        assert config.reads(name, key) and not config.problem(value, kind, dom), (name, key, value)


def test_the_shared_wiring_never_names_an_algorithm():
    paths = sorted(path for family in ("job", "actor_learner", "gradients", "exchange")
                   for path in (PKG / family).glob("*.py"))
    assert len(paths) > 20
    for path in paths:
        text = path.read_text()
        for name in config.ALGORITHMS:
            assert not re.search(rf"\b{name}\b", text), f"{path.name} names the algorithm {name!r}"
    for name in ("config.py", "sections.py", "replay_job.py"):  # "apex" only as agent.algorithm's default
        assert "apex" not in (PKG / name).read_text().replace('"apex"', ""), name


def test_the_shared_wiring_imports_no_algorithm_and_no_torch():
    code = ("import sys; import mpirl.config, mpirl.algos, mpirl.job.wiring, mpirl.job.checks, "
            "mpirl.job.checkpoint, mpirl.metrics.summary, mpirl.cli; "
            "print(sorted(m for m in sys.modules if m.startswith(('torch', 'pettingzoo', 'mpirl.algos.'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    loaded = eval(out.stdout)  # noqa: S307 - our own printout
    assert all(m.endswith(".settings") or m.split(".")[-1] in config.ALGORITHMS for m in loaded), loaded
    assert not [m for m in loaded if m.startswith(("torch", "pettingzoo"))], loaded


def test_a_job_sets_only_keys_its_algorithm_reads():
    cfg = config.JobConfig()
    assert "apex.n_step" in cfg.flat() and "qmix.td_lambda" not in cfg.flat()
    cfg.agent.algorithm = "qmix"
    flat = cfg.flat()
    assert "qmix.td_lambda" in flat and "apex.n_step" not in flat and "replay.alpha" not in flat
    assert all(config.reads("qmix", key) for key in flat)
    cfg.agent.algorithm = "distql"
    flat = cfg.flat()  # DistQL reads its section, env.id, the run's name, seed, directory and stop conditions but
    # train steps, and the checkpoints' cadence but the train steps'
    assert {"distql.tau", "env.id", "run.seed", "run.out_dir", "run.wall_seconds", "checkpoint.keep"} <= set(flat)
    assert not {"topology.buffers", "run.train_steps", "checkpoint.every_steps", "replay.capacity"} & set(flat)


def test_no_algorithm_imports_another_algorithm_s_folder():
    for name in config.ALGORITHMS:
        others = [o for o in config.ALGORITHMS if o != name]
        for path in sorted((PKG / "algos" / name).glob("*.py")):
            for other in others:
                assert f"mpirl.algos.{other}" not in path.read_text(), f"algos/{name}/{path.name} imports algos/{other}"


# The package's layers, lowest first (DESIGN.md, "Layers"): a module imports modules of its own layer and of the
# layers below, never one above. Patterns are module names; ``*`` stands for one name.
LAYERS = (
    ("config", ("mpirl.version", "mpirl.domain", "mpirl.sections", "mpirl.config", "mpirl.replay_job", "mpirl.atomic",
                "mpirl.phases", "mpirl.algos", "mpirl.algos.*", "mpirl.algos.*.settings")),
    ("metrics", ("mpirl.metrics", "mpirl.metrics.*")),
    ("pure computation", ("mpirl.replay", "mpirl.replay.*", "mpirl.agents", "mpirl.agents.*", "mpirl.envs",
                          "mpirl.envs.*")),
    ("comm", ("mpirl.comm", "mpirl.comm.*")),
    ("job", ("mpirl.job", "mpirl.job.*", "mpirl.launcher")),
    ("families' loops", ("mpirl.actor_learner", "mpirl.actor_learner.*", "mpirl.gradients", "mpirl.gradients.*",
                         "mpirl.exchange", "mpirl.exchange.*")),
    ("algos", ("mpirl.algos.*.*",)),
    ("registry", ("mpirl.registry",)),
    ("trained policies", ("mpirl.trained", "mpirl.trained.*")),
    ("Python API", ("mpirl", "mpirl.api")),
    ("bench", ("mpirl.bench", "mpirl.bench.*", "mpirl.bench.*.*")),
    ("cli", ("mpirl.cli", "mpirl.__main__")),
)


def _modules() -> dict[str, Path]:
    found = {}
    for path in PKG.rglob("*.py"):
        parts = path.relative_to(PKG.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules ``name`` imports anywhere in its file: at the top, inside functions, under
    ``if TYPE_CHECKING:`` (``from a import b`` counts ``a.b`` when that is a module, else ``a``)."""
    import ast
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _layer(name: str) -> int:
    best = None
    for index, (_, patterns) in enumerate(LAYERS):
        for pattern in patterns:
            if re.fullmatch(pattern.replace(".", r"\.").replace("*", r"[^.]+"), name):
                # the most specific pattern wins ("mpirl.algos.*.settings" over "mpirl.algos.*.*")
                key = (pattern.count(".") - pattern.count("*") * 0.5, index)
                best = key if best is None or key[0] > best[0] else best
    assert best is not None, f"{name} is in no layer of LAYERS: add it"
    return best[1]


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def test_no_module_imports_a_module_of_a_higher_layer():
    upward = [f"{a} ({LAYERS[_layer(a)][0]}) imports {b} ({LAYERS[_layer(b)][0]})"
              for a, targets in sorted(_graph().items()) for b in sorted(targets) if _layer(b) > _layer(a)]
    assert not upward, "imports against the layers:\n" + "\n".join(upward)


def test_no_two_modules_import_each_other_even_through_others():
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    assert not cycles, "modules that import each other (directly or through others):\n" + "\n".join(
        " ⇄ ".join(c) for c in cycles)


def test_the_import_checks_see_an_import_in_any_place():
    """The two tests above read every kind of import: a cycle through a function-level or a type-only import
    is still caught."""
    graph = _graph()
    assert "mpirl.job.contract" in graph["mpirl.job.checks"]  # at the top
    assert "mpirl.job.checkpoint" in graph["mpirl.job.context"]  # under TYPE_CHECKING
    assert "mpirl.registry" in graph["mpirl.cli"]  # inside a function
    assert _layer("mpirl.algos.apex.settings") == 0 and _layer("mpirl.algos.apex.learner") == 6


def test_a_buffer_rank_of_each_replay_algorithm_imports_no_torch():
    """What the family's buffer loop asks of an algorithm's builder (its server, its memory) is made without
    torch: a buffer rank's memory is its replay, not a framework."""
    code = ("import sys\n"
            "from mpirl.registry import algorithm\n"
            "from mpirl.actor_learner import replay_buffer\n"
            "for name in ('apex', 'qmix', 'impala'):\n"
            "    roles = algorithm(name).ROLES\n"
            "    assert set(roles) >= {'learner', 'buffer', 'actor'}, roles\n"
            "print(sorted(m for m in sys.modules if m.startswith(('torch', 'pettingzoo'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def test_every_actor_learner_builder_makes_its_parts_for_the_loops():
    """Each replay algorithm's builder is one ActorLearnerBuilder whose acting parts the worker and the actors
    read the same way: the step rows and the action shape of its own env."""
    from mpirl.actor_learner.builder import ActorLearnerBuilder
    from mpirl.algos.apex.builder import ApexBuilder
    from mpirl.algos.impala.builder import ImpalaBuilder
    from mpirl.algos.qmix.builder import QmixBuilder
    from mpirl.registry import algorithm

    cfg = config.JobConfig()
    checked = algorithm("apex").check(cfg, 3, "")
    for builder in (ApexBuilder(), ImpalaBuilder()):
        assert isinstance(builder, ActorLearnerBuilder)
        assert builder.action_field(checked.spaces) == ((), np.dtype(np.int64))
        assert set(builder.step_spec(checked.spaces)) >= {"obs", "taken", "reward", "terminated", "truncated"}
    assert isinstance(QmixBuilder(), ActorLearnerBuilder)
    assert ApexBuilder().sender_lag(cfg) == cfg.apex.n_step and ImpalaBuilder().message_rows(cfg, 6) == 6
    assert QmixBuilder().message_rows(cfg, 6) == cfg.comm.send_batch


def test_no_function_is_longer_than_80_lines():
    """A loop that grows past a screen is split into named steps (issue 39: no function in mpirl/ over 80 lines)."""
    import ast
    long = []
    for path in sorted(PKG.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > 80:
                    long.append(f"{path.relative_to(PKG.parent)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "split these into named steps: " + ", ".join(long)
