"""Who is who: actors spread over buffers, and with inference workers, workers over buffers and actors over
workers, node-local first, deterministic from the host list."""

from mpirl.comm.topology import ACTOR, BUFFER, LEARNER, WORKER, Topology, assign_actors, assign_workers


def test_actors_spread_evenly_and_node_local_first():
    hosts = ["a", "a", "b", "a", "b", "b", "a"]  # learner, buffers 1 (a) and 2 (b), actors 3..6
    got = assign_actors(hosts, 2)
    assert got == {3: 1, 4: 2, 5: 2, 6: 1}
    assert assign_actors(hosts, 2, node_local=False) == {3: 1, 4: 2, 5: 1, 6: 2}


def test_workers_take_the_actors_place_toward_the_buffers():
    hosts = ["a", "a", "a", "b", "a", "b", "b", "a", "b"]  # learner, buffer 1, workers 2 (a), 3 (b), actors 4..8
    buffer_of, worker_of = assign_workers(hosts, buffers=1, workers=2)
    assert buffer_of == {2: 1, 3: 1}
    assert worker_of == {4: 2, 5: 3, 6: 3, 7: 2, 8: 2}  # worker 2 takes 3 of 5, worker 3 is full for actor 8
    assert all(hosts[a] == hosts[w] for a, w in worker_of.items() if a != 8)  # on their worker's node while it has room
    topo = Topology(world=None, role="", hosts=hosts, buffer_of=buffer_of, worker_of=worker_of)
    assert [topo.role_of(r) for r in range(9)] == [LEARNER, BUFFER, WORKER, WORKER] + [ACTOR] * 5
    assert topo.served_by(2) == [4, 7, 8] and topo.served_by(3) == [5, 6]
    assert topo.actors_of(1) == [2, 3]  # the buffer's senders are the workers


def test_without_workers_roles_are_unchanged():
    hosts = ["a"] * 5
    topo = Topology(world=None, role="", hosts=hosts, buffer_of=assign_actors(hosts, 1))
    assert [topo.role_of(r) for r in range(5)] == [LEARNER, BUFFER, ACTOR, ACTOR, ACTOR]
    assert topo.served_by(1) == [] and topo.n_actors == 3


def test_the_worker_on_the_learners_rank_serves_every_actor_and_sends_to_the_one_buffer():
    hosts = ["a", "a", "b", "a"]  # learner (and worker), buffer 1, actors 2 (b) and 3
    buffer_of, worker_of = assign_workers(hosts, buffers=1, workers=0)
    assert buffer_of == {0: 1} and worker_of == {2: 0, 3: 0}
    topo = Topology(world=None, role="", hosts=hosts, buffer_of=buffer_of, worker_of=worker_of)
    assert [topo.role_of(r) for r in range(4)] == [LEARNER, BUFFER, ACTOR, ACTOR]
    assert topo.served_by(0) == [2, 3] and topo.actors_of(1) == [0] and topo.n_actors == 1
