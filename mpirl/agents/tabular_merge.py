"""The Q-server's merge (DistQL Eq. 1) compiled with numba: one pass over a worker's pairs (numpy's version
gathers and scatters five arrays one after the other, about 10x slower). Imported by the server only."""

from __future__ import annotations

from numba import njit


@njit(cache=True, nogil=True)
def merge(q, eta, seen, merges, idx, q_i, eta_i, decay):  # pragma: no cover - compiled
    """Eq. 1 over the pairs, one pass (numpy's version gathers and scatters five arrays separately)."""
    new = 0
    for k in range(idx.shape[0]):
        i = idx[k]
        if not seen[i]:
            seen[i] = True  # a new pair keeps its (0, server_eta) start
            new += 1
        ec = min(eta[i], eta_i[k])
        w = ec * ec / eta_i[k]
        q[i] = (1.0 - w) * q[i] + w * q_i[k]
        eta[i] = decay * ec
        merges[i] += 1
    return new
