/* A rank lost mid-collective: every rank opens the file and sets a view, then the last
 * rank fails the collective write, and the others' MPI_File_write_at_all must fail with an
 * MPI error (not hang); rank 0 prints the error class and how long the call took.
 * - `kill` (the default): the last rank kills itself (SIGKILL). Run with
 *   `mpirun --enable-recovery` so that the job outlives the dead rank.
 * - `type`: the last rank's memory type cannot be decoded (a darray spanning 128 MiB, past
 *   what the interposer flattens): it fails with MPI_ERR_TYPE and leaves the session,
 *   then waits in MPI_Barrier for the others.
 * The file is opened with write pipelining off (hint ferry_pipeline=off), so the write
 * itself fails; with a third argument `pipelined` it is on (the default): the write may
 * return at once, and then MPI_File_sync must report the error.
 *   mpirun --enable-recovery -np 2 ./fault FILE [kill|type] [pipelined] */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int r, p;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    MPI_Comm_size(MPI_COMM_WORLD, &p);
    if (argc < 2 || p < 2) {
        fprintf(stderr, "usage: mpirun -np 2+ fault FILE\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_File fh;
    int pipelined = argc > 3 && strcmp(argv[3], "pipelined") == 0;
    MPI_Info info;
    MPI_Info_create(&info);
    if (!pipelined)
        MPI_Info_set(info, "ferry_pipeline", "off");
    if (MPI_File_open(MPI_COMM_WORLD, argv[1], MPI_MODE_CREATE | MPI_MODE_WRONLY, info, &fh) != MPI_SUCCESS) {
        fprintf(stderr, "fault: open failed\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    MPI_File_set_errhandler(fh, MPI_ERRORS_RETURN);
    MPI_Datatype ft;
    MPI_Type_create_resized(MPI_INT, 0, 4 * p, &ft);
    MPI_Type_commit(&ft);
    MPI_File_set_view(fh, 4 * r, MPI_INT, ft, "native", MPI_INFO_NULL);
    int kill_mode = argc < 3 || strcmp(argv[2], "kill") == 0;
    if (kill_mode && r == p - 1) {
        fflush(stdout);
        raise(SIGKILL);
    }
    MPI_Datatype mt = MPI_INT;
    int count = 1024;
    if (!kill_mode && r == p - 1) {
        int g[1] = {1 << 25}, d[1] = {MPI_DISTRIBUTE_BLOCK}, a[1] = {MPI_DISTRIBUTE_DFLT_DARG},
            ps[1] = {1};
        MPI_Type_create_darray(1, 0, 1, g, d, a, ps, MPI_ORDER_C, MPI_INT, &mt);
        MPI_Type_commit(&mt);
        count = 1; /* fails before the buffer is touched */
    }
    int data[1024] = {0};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = MPI_File_write_at_all(fh, 0, data, count, mt, MPI_STATUS_IGNORE);
    const char *call = "write_at_all";
    if (pipelined && rc == MPI_SUCCESS) { /* the write's error comes back from here */
        rc = MPI_File_sync(fh);
        call = "sync";
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
    int cls = MPI_SUCCESS, len = 0;
    char text[MPI_MAX_ERROR_STRING] = "";
    MPI_Error_class(rc, &cls);
    MPI_Error_string(rc, text, &len);
    if (r == 0) {
        printf("fault: rank 0: %s returned class %d%s after %.0f ms: %s\n", call, cls,
               cls == MPI_ERR_OTHER ? " (MPI_ERR_OTHER)" : "", ms, text);
        printf(rc != MPI_SUCCESS ? "fault: ok\n" : "fault: the write succeeded\n");
        fflush(stdout);
    }
    if (!kill_mode && r == p - 1)
        printf("fault: rank %d: write_at_all returned class %d%s\n", r, cls,
               cls == MPI_ERR_TYPE ? " (MPI_ERR_TYPE)" : "");
    fflush(stdout);
    if (kill_mode) /* the communicator has a dead rank: leave without collective calls */
        _exit(rc != MPI_SUCCESS ? 0 : 6);
    /* As programs do after an error: meet the other ranks first (rank p-1 is here at once,
     * the others only once their write failed). */
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_File_close(&fh);
    MPI_Type_free(&ft);
    MPI_Info_free(&info);
    MPI_Finalize();
    return rc != MPI_SUCCESS ? 0 : 6;
}
