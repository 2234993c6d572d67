"""Parallel HDF5 through h5py (driver='mpio'), unmodified: a 2-D int dataset of 8p x 16,
rank r writing rows 8r..8r+7 with a collective hyperslab write, then every rank reading
the transposed block of columns collectively. The file is then checked with the ordinary
local tools (h5py without MPI, h5dump).
    mpirun -np 2 python3 h5py_grid.py FILE"""
import sys

import h5py
import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
r, p = comm.rank, comm.size
rows, cols = 8 * p, 16
grid = np.arange(rows * cols, dtype="i4").reshape(rows, cols)

with h5py.File(sys.argv[1], "w", driver="mpio", comm=comm) as f:
    d = f.create_dataset("grid", (rows, cols), dtype="i4")
    f.attrs["ranks"] = p
    with d.collective:
        d[8 * r : 8 * r + 8, :] = grid[8 * r : 8 * r + 8, :]

with h5py.File(sys.argv[1], "r", driver="mpio", comm=comm) as f:
    d = f["grid"]
    lo, hi = r * cols // p, (r + 1) * cols // p
    with d.collective:
        got = d[:, lo:hi]
    assert (got == grid[:, lo:hi]).all(), "the collective read returned other ints"

if r == 0:
    print(f"h5py: ok, {p} ranks")
