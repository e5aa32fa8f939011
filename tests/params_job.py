"""Parameters sent to each member on its own (:class:`mpirl.comm.params.ParamSends`): the root publishes 200
versions and the stop while rank 2 does not look at all; only then does it tell rank 2 to go (on another tag). A
root that waited for rank 2 (as a broadcast does) never gets there, and the job hangs. Rank 1 follows as it goes.
Run by ``tests/test_params.py``: ``mpiexec -n 3 python tests/params_job.py OUT.json``."""

from __future__ import annotations

import json
import sys
import time

import numpy as np
from mpi4py import MPI

from mpirl.comm.params import ParamFollower, ParamSends

N_PARAMS, VERSIONS, GO = 1000, 200, 5  # 4 KB a message: above some eager limits, below others


def main() -> None:
    comm = MPI.COMM_WORLD
    channel = ParamSends(comm, N_PARAMS)
    seen: list[int] = []
    if comm.rank == 0:
        for v in range(1, VERSIONS + 1):
            channel.publish(v, np.full(N_PARAMS, v, np.float32))
            channel.pump()
        channel.publish(VERSIONS + 1, None, stop=True)
        comm.send("go", dest=2, tag=GO)  # only now: rank 2 has not received anything but what was on the way
        channel.close()
        result = {"published": channel.broadcasts, "sent": channel.sent}
    else:
        follower = ParamFollower(channel, lambda p: seen.append(int(p[0])) if p[0] == p[-1] else seen.append(-1))
        if comm.rank == 2:
            comm.recv(source=0, tag=GO)
        follower.start()
        while not follower.stopped:
            if not follower.poll():
                time.sleep(1e-4)
        result = {"seen": seen}
    results = comm.gather(result, root=0)
    if comm.rank == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(results, f)


if __name__ == "__main__":
    main()
