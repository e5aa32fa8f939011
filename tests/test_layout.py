"""Message layouts: pack/unpack round trips, compact sizes, zero-copy views."""

import numpy as np

from mpirl.agents.dqn import transition_spec
from mpirl.comm.layout import Layout
from mpirl.comm.messages import experience_layout, request_layout, sample_layout


def records(spec, n, rng):
    out = {}
    for name, (shape, dtype) in spec.items():
        if dtype == np.bool_:
            out[name] = rng.random((n, *shape)) < 0.5
        elif np.issubdtype(dtype, np.integer):
            out[name] = rng.integers(0, 255, size=(n, *shape)).astype(dtype)
        else:
            out[name] = rng.standard_normal((n, *shape)).astype(dtype)
    return out


def test_round_trip_keeps_values_and_dtypes():
    rng = np.random.default_rng(0)
    spec = transition_spec((4, 84, 84), np.uint8)
    lay = experience_layout(spec, 16)
    buf = lay.buffer()
    rec = records({**spec, "priority": ((), np.float32)}, 11, rng)
    nbytes = lay.pack(buf, rec, actor=3, env_steps=1234, episodes=2, ep_return=[1.5, 2.5], final=0)
    wire = buf[:nbytes].copy()  # what a receiver gets
    views = lay.views(wire)
    assert lay.rows(wire) == 11 and lay.get(wire, "actor") == 3 and lay.get(wire, "env_steps") == 1234
    assert list(lay.get(wire, "ep_return")[:2]) == [1.5, 2.5]
    for name, arr in rec.items():
        assert views[name].dtype == arr.dtype and views[name].shape == arr.shape
        np.testing.assert_array_equal(views[name], arr)
    assert views["obs"].dtype == np.uint8  # frames stay uint8 on the wire
    assert np.shares_memory(views["obs"], wire)  # zero-copy


def test_message_carries_only_its_rows():
    spec = transition_spec((4,), np.float32)
    lay = sample_layout(spec, 64)
    per_row = sum(int(np.prod(s)) * np.dtype(d).itemsize for s, d in lay.fields.values())
    assert lay.nbytes(0) == lay.header_len * 8
    assert lay.nbytes(64) - lay.nbytes(0) <= 64 * per_row + 8 * len(lay.fields)
    assert lay.nbytes(1) < lay.nbytes(64) == lay.max_nbytes
    # CartPole row: ids 8 + versions 8 + probs 8 + priority 4 + obs 16 + action 8 + reward 4 + next 16 + done 1 + discount 4
    assert per_row == 77


def test_blocks_are_aligned_and_do_not_overlap():
    lay = Layout({"a": 3}, {"x": ((3,), np.uint8), "y": ((), np.float64), "z": ((2,), np.int32)}, 10)
    buf = lay.buffer()
    v = lay.views(buf, 7)
    for arr in v.values():
        assert arr.ctypes.data % 8 == 0
    v["x"][:] = 1
    v["y"][:] = 2.0
    v["z"][:] = 3
    assert (v["x"] == 1).all() and (v["y"] == 2.0).all() and (v["z"] == 3).all()


def test_request_without_priorities():
    lay = request_layout(32)
    buf = lay.buffer()
    n = lay.pack(buf, {}, kind=1, seq=5, want=32, consumed=100)
    assert n == lay.header_len * 8 and lay.rows(buf) == 0 and lay.get(buf, "want") == 32


def test_counted_field_has_its_own_row_count():
    lay = Layout({"kind": 1}, {"idx": ((4,), np.int32), "priority": ((), np.float32)}, 10,
                 counted={"frames": ((3, 3), np.uint8, 40)})
    buf = lay.buffer()
    assert lay.max_nbytes >= lay.header_len * 8 + 10 * 16 + 10 * 4 + 40 * 9
    views = lay.views(buf, 5, frames=40)  # a writer's view: room for the most frames
    views["idx"][:] = np.arange(20).reshape(5, 4)
    views["frames"][:7] = np.arange(63, dtype=np.uint8).reshape(7, 3, 3)
    lay.set(buf, rows=5, kind=2, frames_rows=7)
    n = lay.nbytes(5, frames=7)
    assert n < lay.nbytes(5, frames=40)
    got = lay.views(np.frombuffer(buf[:n].tobytes(), dtype=np.uint8))  # only n bytes arrived
    assert got["frames"].shape == (7, 3, 3) and got["idx"].shape == (5, 4)
    np.testing.assert_array_equal(got["frames"].reshape(-1), np.arange(63))
    np.testing.assert_array_equal(got["idx"].reshape(-1), np.arange(20))
