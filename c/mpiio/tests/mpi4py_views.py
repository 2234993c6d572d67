"""mpi4py's MPI.File, unmodified: Set_view + Write_at_all / Read_at_all of every other int
(rank r of p owns ints r, r+p, ...), plus the calls mpi4py programs make around them
(Get_view, Get_amode, Get_group, Get_info, Seek / Get_position, Get_byte_offset,
Get_type_extent, Get_size, Preallocate, Get_atomicity, Iwrite_at / Iread_at, errhandlers,
py2f / f2py). Run on a local path and on a ferry:// URL, the files must be identical.
    mpirun -np 2 python3 mpi4py_views.py FILE"""
import sys

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
r, p = comm.rank, comm.size
n = 4096
fh = MPI.File.Open(comm, sys.argv[1], MPI.MODE_CREATE | MPI.MODE_RDWR)
fh.Set_errhandler(MPI.ERRORS_RETURN)
assert fh.Get_amode() == MPI.MODE_CREATE | MPI.MODE_RDWR
assert fh.Get_group().Get_size() == p
assert not fh.Get_atomicity()
fh.Get_info().Free()
assert MPI.File.f2py(fh.py2f()) == fh

ft = MPI.INT.Create_resized(0, 4 * p).Commit()
fh.Set_view(4 * r, MPI.INT, ft)
disp, etype, filetype, datarep = fh.Get_view()
assert disp == 4 * r and etype == MPI.INT and datarep == "native"
assert filetype.Get_extent() == (0, 4 * p)
filetype.Free()
assert fh.Get_type_extent(MPI.INT) == 4
assert fh.Get_byte_offset(10) == 4 * r + 40 * p

mine = np.arange(n, dtype="i4") + 1_000_000 * (r + 1)
fh.Write_at_all(0, mine)
# The individual file pointer: the second half again, through Seek and Write_all.
fh.Seek(n // 2)
assert fh.Get_position() == n // 2
fh.Write_all(mine[n // 2 :])
assert fh.Get_position() == n
# Non-blocking, independent: one int more past the end of the collective part.
req = fh.Iwrite_at(n, mine[:1])
req.Wait()
fh.Sync()
comm.Barrier()
assert fh.Get_size() == 4 * p * (n + 1)

back = np.zeros(n, dtype="i4")
fh.Read_at_all(0, back)
assert (back == mine).all(), "Read_at_all returned other ints"
one = np.zeros(1, dtype="i4")
fh.Iread_at(n, one).Wait()
assert one[0] == mine[0]
fh.Preallocate(4 * p * (n + 1))
fh.Close()
ft.Free()
if r == 0:
    print(f"mpi4py: ok, {p} ranks")
