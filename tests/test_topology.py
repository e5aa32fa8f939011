"""Who is who: the groups of each declared link, made from the host list alone (no MPI): actors spread over
buffers, and with inference workers, workers over buffers and actors over workers, node-local first."""

from types import SimpleNamespace

import pytest

from mpirl.comm.topology import Layout, Link, Topology, plan
from mpirl.actor_learner.replay_layout import ACTOR, BUFFER, LEARNER, WORKER, layout


def star(hosts, buffers, workers=0, on_learner=False, node_local=True, learners=1) -> Topology:
    """The replay algorithms' layout for a world of ``len(hosts)`` ranks, planned without MPI."""
    t = SimpleNamespace(buffers=buffers, worker_ranks=workers, on_learner=on_learner, learners=learners)
    lay = layout(SimpleNamespace(topology=t), len(hosts))
    return Topology(world=None, role="", hosts=hosts, layout=lay, groups=plan(lay, hosts, node_local))


def test_actors_spread_evenly_and_node_local_first():
    hosts = ["a", "a", "b", "a", "b", "b", "a"]  # learner, buffers 1 (a) and 2 (b), actors 3..6
    assert star(hosts, 2).buffer_of == {3: 1, 4: 2, 5: 2, 6: 1}
    assert star(hosts, 2, node_local=False).buffer_of == {3: 1, 4: 2, 5: 1, 6: 2}


def test_workers_take_the_actors_place_toward_the_buffers():
    hosts = ["a", "a", "a", "b", "a", "b", "b", "a", "b"]  # learner, buffer 1, workers 2 (a), 3 (b), actors 4..8
    topo = star(hosts, buffers=1, workers=2)
    buffer_of, worker_of = topo.buffer_of, topo.worker_of
    assert buffer_of == {2: 1, 3: 1}
    assert worker_of == {4: 2, 5: 3, 6: 3, 7: 2, 8: 2}  # worker 2 takes 3 of 5, worker 3 is full for actor 8
    assert all(hosts[a] == hosts[w] for a, w in worker_of.items() if a != 8)  # on their worker's node while it has room
    assert [topo.role_of(r) for r in range(9)] == [LEARNER, BUFFER, WORKER, WORKER] + [ACTOR] * 5
    assert topo.served_by(2) == [4, 7, 8] and topo.served_by(3) == [5, 6]
    assert topo.actors_of(1) == [2, 3]  # the buffer's senders are the workers


def test_without_workers_roles_are_unchanged():
    topo = star(["a"] * 5, 1)
    assert [topo.role_of(r) for r in range(5)] == [LEARNER, BUFFER, ACTOR, ACTOR, ACTOR]
    assert topo.served_by(1) == [] and topo.n_actors == 3


def test_the_worker_on_the_learners_rank_serves_every_actor_and_sends_to_the_one_buffer():
    hosts = ["a", "a", "b", "a"]  # learner (and worker), buffer 1, actors 2 (b) and 3
    topo = star(hosts, buffers=1, on_learner=True)
    assert topo.buffer_of == {0: 1} and topo.worker_of == {2: 0, 3: 0}
    assert [topo.role_of(r) for r in range(4)] == [LEARNER, BUFFER, ACTOR, ACTOR]
    assert topo.served_by(0) == [2, 3] and topo.actors_of(1) == [0] and topo.n_actors == 1
    # the learner keeps its own parameters: the buffer broadcasts to no sender
    assert topo.layout.link("parameters", BUFFER) is None


def test_a_link_groups_its_members_around_its_hubs_and_links_between_the_same_roles_group_alike():
    lay = Layout({"server": (0,), "worker": (1, 2, 3)}, (Link("gradients", "worker", "server"),
                                                        Link("parameters", "server", "worker", hub="source")))
    groups = plan(lay, ["a", "b", "a", "b"])
    assert groups[lay.links[0]] == groups[lay.links[1]] == {1: 0, 2: 0, 3: 0}
    assert lay.role_of(0) == "server" and lay.count("worker") == 3


@pytest.mark.parametrize("ranks, links, message", [
    ({"a": (0,), "b": (2,)}, (), "ranks are 0..N-1"),
    ({"a": (0,), "b": (0, 1)}, (), "ranks are 0..N-1"),
    ({"a": (0,)}, (Link("experience", "a", "c"),), "roles the layout does not have"),
])
def test_a_layout_that_is_not_one_role_per_rank_is_refused(ranks, links, message):
    with pytest.raises(ValueError, match=message):
        Layout(ranks, links)


def test_two_learners_come_first_and_the_rest_shifts_by_one():
    from mpirl.actor_learner.replay_layout import rank_files, role_map
    hosts = ["a"] * 7  # learners 0-1, buffers 2-3, actors 4..6
    topo = star(hosts, 2, learners=2)
    assert topo.layout.ranks[LEARNER] == (0, 1) and topo.buffers == [2, 3]
    assert topo.buffer_of == {4: 2, 5: 3, 6: 2}
    assert role_map(topo) == "0-1 learners; 2 buffer, 4,6 actors of buffer 2; 3 buffer, 5 actor of buffer 3"
    assert rank_files(topo) == {"learner": "learner.h5", "learner_1": "learner_1.h5", "buffer_2": "buffer_2.h5",
                                "buffer_3": "buffer_3.h5"}
