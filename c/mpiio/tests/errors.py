"""Bad input and what ferry does not support, each a clear MPI error of the right class
through the file's error handler (mpi4py raises MPI.Exception): a bad token, a path
outside the server's roots, pieces of one collective write that overlap, a negative
displacement, atomic mode, shared file pointers, another data representation. Also the
hint ferry_mode=independent, MPI_File_delete and MPI_MODE_DELETE_ON_CLOSE, write
pipelining (on by default: a failing write's error comes back from the next sync) and the
read cache (a rank reads twice; another rank's write is seen after sync-barrier-sync).
    mpirun -np 2 python3 errors.py URL   (URL: ferry+DRIVER://where/d/NAME)"""
import sys

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
r, p = comm.rank, comm.size
url = sys.argv[1]
RW = MPI.MODE_CREATE | MPI.MODE_RDWR


def fails(cls, call, *args):
    try:
        call(*args)
    except MPI.Exception as e:
        assert e.Get_error_class() == cls, (
            f"{call.__name__}: class {e.Get_error_class()} ({e.Get_error_string()}), not {cls}"
        )
        assert "ferry: " in e.Get_error_string(), e.Get_error_string()
        return
    raise AssertionError(f"{call.__name__} succeeded")


# Opening: a bad token, a path outside the roots.
bad = MPI.Info.Create()
bad.Set("ferry_token", "not-the-token")
fails(MPI.ERR_ACCESS, MPI.File.Open, comm, url, RW, bad)
bad.Free()
outside = url.rsplit("/d/", 1)[0] + "/d/../../etc/passwd"
fails(MPI.ERR_ACCESS, MPI.File.Open, comm, outside, MPI.MODE_RDONLY)

# Pipelining off: a refused write fails its own call.
off = MPI.Info.Create()
off.Set("ferry_pipeline", "off")
fh = MPI.File.Open(comm, url, RW, off)
off.Free()
fh.Set_errhandler(MPI.ERRORS_RETURN)
# Both ranks' views place their ints on the same bytes: the write is refused, nothing lands.
fh.Set_view(0, MPI.INT, MPI.INT)
fails(MPI.ERR_ARG, fh.Write_at_all, 0, np.arange(4, dtype="i4"))
assert fh.Get_size() == 0, "a refused write wrote something"
fh.Close()

# Pipelining on (the default): the refused write returns, and Sync reports its error.
fh = MPI.File.Open(comm, url, RW)
fh.Set_errhandler(MPI.ERRORS_RETURN)
assert fh.Get_info().Get("ferry_pipeline") is None
fh.Set_view(0, MPI.INT, MPI.INT)
fh.Write_at_all(0, np.arange(4, dtype="i4"))
fails(MPI.ERR_ARG, fh.Sync)
assert fh.Get_size() == 0, "a refused write wrote something"
fails(MPI.ERR_ARG, fh.Set_view, -8, MPI.INT, MPI.INT)
fails(MPI.ERR_UNSUPPORTED_OPERATION, fh.Set_atomicity, True)
fails(MPI.ERR_UNSUPPORTED_OPERATION, fh.Write_shared, np.arange(4, dtype="i4"))
fails(MPI.ERR_UNSUPPORTED_OPERATION, fh.Seek_shared, 0)
fails(MPI.ERR_UNSUPPORTED_DATAREP, fh.Set_view, 0, MPI.INT, MPI.INT, "external32")

fh.Close()

# ferry_mode=independent: collective calls move each rank's data on its own.
ind = MPI.Info.Create()
ind.Set("ferry_mode", "independent")
ind.Set("romio_cb_write", "enable")  # ROMIO's hints are accepted and ignored
fh = MPI.File.Open(comm, url, RW, ind)
assert fh.Get_info().Get("ferry_mode") == "independent"
ft = MPI.INT.Create_resized(0, 4 * p).Commit()
fh.Set_view(4 * r, MPI.INT, ft)
mine = np.arange(100, dtype="i4") * p + r
fh.Write_at_all(0, mine)
fh.Sync()
comm.Barrier()
back = np.zeros(100, dtype="i4")
fh.Read_at_all(0, back)
assert (back == mine).all()
fh.Close()
ft.Free()

# The read cache (on by default): rank 0 writes, sync-barrier-sync, rank 1 reads twice (the
# second read from its cache); rank 0 writes more and rank 1 reads again without syncing
# (old or new data, never a mix of garbage); after sync-barrier-sync it sees the new data.
fh = MPI.File.Open(comm, url, RW)
first, second = np.arange(64, dtype="i4"), np.arange(64, dtype="i4") + 1000
if r == 0:
    fh.Write_at(0, first)
fh.Sync()
comm.Barrier()
fh.Sync()
back = np.zeros(64, dtype="i4")
for _ in range(2):
    fh.Read_at_all(0, back)
    assert (back == first).all(), back
if r == 0:
    fh.Write_at(0, second)
comm.Barrier()
fh.Read_at(0, back)
assert (back == first).all() or (back == second).all(), back
fh.Sync()
comm.Barrier()
fh.Sync()
fh.Read_at_all(0, back)
assert (back == second).all(), back
fh.Close()

# MPI_File_delete, and MPI_MODE_DELETE_ON_CLOSE: the server removes the file.
comm.Barrier()
if r == 0:
    MPI.File.Delete(url)
    fails(MPI.ERR_NO_SUCH_FILE, MPI.File.Delete, url)
comm.Barrier()
fails(MPI.ERR_NO_SUCH_FILE, MPI.File.Open, comm, url, MPI.MODE_RDONLY)
fh = MPI.File.Open(comm, url, RW | MPI.MODE_DELETE_ON_CLOSE)
fh.Write_at_all(4 * r, np.arange(1, dtype="i4"))
fh.Close()
fails(MPI.ERR_NO_SUCH_FILE, MPI.File.Open, comm, url, MPI.MODE_RDONLY)
if r == 0:
    print(f"errors: ok, {p} ranks")
