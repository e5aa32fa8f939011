"""A trained policy as a TorchScript file: ``torch.jit.load(path)`` in any Python with torch (no mpirl) gives a module
mapping a batch of observations (and a recurrent policy's state) to the environment's actions, deterministically,
with the job's preprocessing inside (:mod:`mpirl.agents.deployed`). Beside it with ``--pt2``, the same as a
torch.export program (torch 2.13 deprecates TorchScript for it), and with ``--onnx``, ONNX.

The module is traced on observations the policy met in a few played episodes, then checked on them: the file, loaded
back, must give the actions the policy gives (:meth:`~mpirl.agents.trained_policy.TrainedPolicy.act`) on every
one, or nothing is written. What the module takes and gives rides in the file (``torch.jit.load(path,
_extra_files={"mpirl.json": ""})``): the observation's shape and dtype, the inputs' and outputs' names, the env
id, the algorithm and the checkpoint.
"""

from __future__ import annotations

import io
import json
import os
import warnings
from pathlib import Path

import numpy as np
import torch

from mpirl.config import ConfigError
from mpirl.trained.play import episode_seed, game_seed

CHECK_OBSERVATIONS = 1_000  # observations, from played episodes, the export is checked on


def observations(policy, n: int, seed: int) -> tuple[list, list]:
    """Up to ``n`` observations of episodes the policy plays (and where each episode starts)."""
    obs, starts = [], []
    game = policy.game(game_seed(seed), render=False)
    try:
        k = 0
        while len(obs) < n:
            o, state, start, done = game.reset(episode_seed(seed, k)), None, True, False
            while not done and len(obs) < n:
                obs.append(o)
                starts.append(start)
                action, state = policy.act(o, state, episode_start=start)
                o, _, done = game.step(action)
                start = False
            k += 1
    finally:
        game.close()
    return obs, starts


def _inputs(policy, obs: list, starts: list) -> tuple:
    """The module's inputs for the batch ``obs`` (one step of many games; each its own, zero or given, state)."""
    if isinstance(obs[0], tuple):  # a team's (observations, available actions)
        o = torch.as_tensor(np.stack([x[0] for x in obs]))
        avail = torch.as_tensor(np.stack([x[1] for x in obs]))
        h, last = policy.initial_state(len(obs))
        return o, avail, torch.as_tensor(last), torch.as_tensor(h)
    o = torch.as_tensor(np.stack(obs))
    if policy.recurrent:
        h, c = policy.initial_state(len(obs))
        return o, torch.as_tensor(h), torch.as_tensor(c), torch.as_tensor(np.asarray(starts, bool))
    return (o,)


def _names(inputs: tuple, team: bool) -> list[str]:
    return ["obs", "avail", "last_actions", "h"] if team else ["obs", "h", "c", "first"][:len(inputs)]


def _mismatches(loaded, policy, obs: list, starts: list, inputs: tuple) -> int:
    """Observations on which the loaded module and the policy act differently. A feed-forward policy: the whole
    batch at once. A recurrent one: along the played episodes in order, each carrying its own state from step to step
    (zeroed where an episode starts), so the state's passage through the module is checked too."""
    with torch.no_grad():
        if not policy.recurrent:
            got = loaded(*inputs).numpy()
            want, _ = policy.act(np.stack(obs), None, episode_start=np.ones(len(obs), bool))
            return _differ(got, np.asarray(want))
        wrong, state = 0, None
        team = isinstance(obs[0], tuple)
        h, other = (torch.as_tensor(x) for x in policy.initial_state(1))  # (h, c), or a team's (h, last actions)
        for o, start in zip(obs, starts):
            want, state = policy.act(o, state, episode_start=start)
            if team:
                h, other = (torch.zeros_like(h), torch.zeros_like(other)) if start else (h, other)
                a, h = loaded(torch.as_tensor(o[0])[None], torch.as_tensor(o[1])[None], other, h)
                other = torch.nn.functional.one_hot(a, policy.n_actions).float()
            else:
                a, h, other = loaded(torch.as_tensor(o)[None], h, other, torch.tensor([bool(start)]))
            wrong += _differ(a.numpy()[0], np.asarray(want))
        return wrong


def _differ(got: np.ndarray, want: np.ndarray) -> int:
    if got.shape != want.shape:
        return max(1, len(want))
    same = np.isclose(got, want, rtol=1e-5, atol=1e-6) if got.dtype.kind == "f" else got == want
    return int(np.size(same) - np.sum(same)) if same.ndim <= 1 else int(np.sum(~same.reshape(len(same), -1).all(1)))


def export(policy, out: Path, onnx: bool = False, seed: int = 0, pt2: bool = False) -> list[str]:
    """Trace, check and write ``policy``'s module to ``out`` (and, if asked, ``out`` with ``.pt2``: a torch.export
    program checked the same way; with ``.onnx``); what was written, in words."""
    try:
        module = policy.module().cpu().eval()
    except NotImplementedError as err:
        raise ConfigError("RUN_DIR", f"{err}") from None
    if onnx:
        try:
            import onnx as _  # noqa: F401 - torch's exporter needs it
        except ImportError:
            raise ConfigError("--onnx", "needs the onnx package: pip install onnx (or leave --onnx out)") from None
    obs, starts = observations(policy, CHECK_OBSERVATIONS, seed)
    inputs = _inputs(policy, obs, starts)
    team = isinstance(obs[0], tuple)
    with torch.no_grad(), warnings.catch_warnings():
        # The tracer warns about the GRU's and LSTM's shape checks (constant for a module of fixed sizes) and torch
        # 2.13 about TorchScript's deprecation in favour of torch.export: the check below is what says it works.
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        traced = torch.jit.trace(module, inputs, check_trace=False)
    meta = {"env_id": policy.cfg.env.id, "algorithm": policy.cfg.agent.algorithm, "source": policy.source,
            "inputs": _names(inputs, team),
            "obs_shape": list(inputs[0].shape[1:]), "obs_dtype": str(inputs[0].dtype).replace("torch.", ""),
            "outputs": {1: ["actions"], 4: ["actions", "h"] if team else ["actions", "h", "c"]}[len(inputs)],
            "deterministic": True}
    buffer = io.BytesIO()
    torch.jit.save(traced, buffer, _extra_files={"mpirl.json": json.dumps(meta)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        loaded = torch.jit.load(io.BytesIO(buffer.getvalue()))
    wrong = _mismatches(loaded, policy, obs, starts, inputs)
    if wrong:
        raise RuntimeError(f"the traced policy differs from the policy on {wrong} of {len(obs)} observations; "
                           "nothing was written")
    _write_whole(out, buffer.getvalue())
    shape = ", ".join(["N", *map(str, meta["obs_shape"])])
    said = [f"TorchScript {out} ({out.stat().st_size / 2**10:.0f} KiB): ({', '.join(meta['inputs'])}) -> "
            f"({', '.join(meta['outputs'])}), obs [{shape}] {meta['obs_dtype']}; the same actions as the policy on "
            f"{len(obs):,} observations of played episodes"]
    if pt2:
        said.append(_pt2(module, inputs, meta, out.with_suffix(".pt2"), policy, obs, starts))
    if onnx:
        said.append(_onnx(module, inputs, meta, out.with_suffix(".onnx")))
    return said


def _write_whole(path: Path, data: bytes) -> None:
    """``data`` as ``path``, complete or not at all: written under a partial name beside it, then renamed; the
    partial file is gone whatever fails."""
    tmp = path.with_name(f".{path.name}.partial-{os.getpid()}")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _pt2(module, inputs: tuple, meta: dict, path: Path, policy, obs: list, starts: list) -> str:
    """The module as a torch.export program (TorchScript's successor: ``torch.export.load(path).module()``), any
    batch size, checked against the policy as the TorchScript file is."""
    batch = torch.export.Dim("batch")
    with torch.no_grad():
        program = torch.export.export(module, inputs, dynamic_shapes=tuple({0: batch} for _ in inputs))
    buffer = io.BytesIO()
    torch.export.save(program, buffer, extra_files={"mpirl.json": json.dumps(meta)})
    wrong = _mismatches(torch.export.load(io.BytesIO(buffer.getvalue())).module(), policy, obs, starts, inputs)
    if wrong:
        raise RuntimeError(f"the exported program differs from the policy on {wrong} of {len(obs)} observations; "
                           f"{path} was not written")
    _write_whole(path, buffer.getvalue())
    return f"torch.export {path} ({path.stat().st_size / 2**10:.0f} KiB): the same actions on the same observations"


def _onnx(module, inputs: tuple, meta: dict, path: Path) -> str:
    names = meta["inputs"]
    axes = {n: {0: "batch"} for n in names} | {o: {0: "batch"} for o in meta["outputs"]}
    try:
        torch.onnx.export(module, inputs, str(path), input_names=names, output_names=meta["outputs"],
                          dynamic_axes=axes, dynamo=False)
    except Exception as err:  # noqa: BLE001 - an exporter that cannot take the module says why in its own words
        first = (str(err).strip().splitlines() or [""])[0][:200]
        raise ConfigError("--onnx", f"torch could not export the policy to ONNX ({type(err).__name__}: {first}); "
                                    "the TorchScript file was written") from None
    import onnx
    onnx.checker.check_model(str(path))  # a well-formed graph (running it needs onnxruntime, not required here)
    return f"ONNX {path} (checked by onnx.checker)"
