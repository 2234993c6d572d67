/* The ECIO seed's pattern, an unmodified MPI-IO program: COUNT MPI_INTs over the ranks,
 * block length 1, stride 2 (rank r of p owns every other int of one half of the file:
 * ranks 2k and 2k+1 interleave in half k), written collectively, synced, read back
 * collectively and compared. Run on a local path (ROMIO) and on a ferry:// URL
 * (LD_PRELOAD=libferry-mpiio.so) the files must be byte-identical.
 *   mpirun -np 2 ./seed FILE COUNT */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(call)                                                                 \
    do {                                                                            \
        int rc_ = (call);                                                           \
        if (rc_ != MPI_SUCCESS) {                                                   \
            char s_[MPI_MAX_ERROR_STRING];                                          \
            int l_;                                                                 \
            MPI_Error_string(rc_, s_, &l_);                                         \
            fprintf(stderr, "seed: %s failed: %s\n", #call, s_);                    \
            MPI_Abort(MPI_COMM_WORLD, 2);                                           \
        }                                                                           \
    } while (0)

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, p;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &p);
    if (argc < 3) {
        fprintf(stderr, "usage: seed FILE COUNT\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    long count = atol(argv[2]);
    int n = (int)(count / p);
    int pairs = p > 1 ? 2 : 1;
    MPI_Datatype vec, ft;
    MPI_Type_vector(n, 1, pairs, MPI_INT, &vec);
    MPI_Type_create_resized(vec, 0, (MPI_Aint)pairs * 4 * n, &ft);
    MPI_Type_commit(&ft);
    MPI_Offset disp = (MPI_Offset)(rank / 2) * pairs * 4 * n + (rank % 2) * 4;

    int *mine = malloc(sizeof(int) * (size_t)n), *back = malloc(sizeof(int) * (size_t)n);
    for (int i = 0; i < n; i++)
        mine[i] = (rank << 24) | i;

    MPI_File fh;
    CHECK(MPI_File_open(MPI_COMM_WORLD, argv[1], MPI_MODE_CREATE | MPI_MODE_RDWR, MPI_INFO_NULL, &fh));
    CHECK(MPI_File_set_errhandler(fh, MPI_ERRORS_RETURN));
    CHECK(MPI_File_set_view(fh, disp, MPI_INT, ft, "native", MPI_INFO_NULL));
    MPI_Status st;
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    CHECK(MPI_File_write_at_all(fh, 0, mine, n, MPI_INT, &st));
    double t_write = MPI_Wtime() - t0;
    int got = -1;
    MPI_Get_count(&st, MPI_INT, &got);
    if (got != n) {
        fprintf(stderr, "seed: rank %d wrote %d ints, not %d\n", rank, got, n);
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
    CHECK(MPI_File_sync(fh));
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = MPI_Wtime();
    CHECK(MPI_File_read_at_all(fh, 0, back, n, MPI_INT, &st));
    double t_read = MPI_Wtime() - t0;
    MPI_Get_count(&st, MPI_INT, &got);
    for (int i = 0; i < n; i++)
        if (back[i] != mine[i] || got != n) {
            fprintf(stderr, "seed: rank %d read %d ints, int %d is %x, not %x\n", rank, got, i,
                    back[i], mine[i]);
            MPI_Abort(MPI_COMM_WORLD, 4);
        }
    MPI_Offset size;
    CHECK(MPI_File_get_size(fh, &size));
    CHECK(MPI_File_close(&fh));
    if (rank == 0)
        printf("seed: ok, %d ranks, %ld ints, file %lld bytes, write_at_all %.1f ms, "
               "read_at_all %.1f ms (rank 0)\n",
               p, (long)n * p, (long long)size, t_write * 1e3, t_read * 1e3);
    MPI_Type_free(&ft);
    MPI_Type_free(&vec);
    free(mine);
    free(back);
    MPI_Finalize();
    return 0;
}
