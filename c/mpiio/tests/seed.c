/* The ECIO seed's pattern, an unmodified MPI-IO program: COUNT MPI_INTs over the ranks,
 * block length 1, stride 2 (rank r of p owns every other int of one half of the file:
 * ranks 2k and 2k+1 interleave in half k), written collectively, synced, read back
 * collectively and compared. Run on a local path (ROMIO) and on a ferry:// URL
 * (LD_PRELOAD=libferry-mpiio.so) the files must be byte-identical.
 *   mpirun -np 2 ./seed FILE COUNT [ITERS [PHASE [KEY=VALUE ...]]]
 * ITERS (default 1) repeats the timed call; PHASE is `wr` (default: time both), `w` (time
 * the writes; one read checks them) or `r` (one write; time the reads). KEY=VALUE pairs go
 * into the MPI_Info of the open (romio_cb_write=disable, ferry_mode=independent, ...),
 * except seed_budget_s=S: stop repeating once the timed calls took S seconds.
 * Each call is timed with MPI_Wtime between barriers, its time the slowest rank's; rank 0
 * prints one line per timed phase (`ms` each call's time, `cpu_s` the user+system CPU of
 * all ranks over the timed calls, from getrusage):
 *   seed: times phase=write iters=N ms=T1,T2,... cpu_s=C
 * then `seed: ok, ...` (what ferry's tests look for). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

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

/* User plus system CPU seconds of this process so far. */
static double cpu_now(void)
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (double)(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
           (double)(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

/* What a timed phase does and learns. */
struct phase {
    const char *name;
    int write;
    int iters;
    double budget_s;
};

/* One collective call of the phase; rank's count checked. */
static void call(MPI_File fh, int write, int *buf, int n, int rank)
{
    MPI_Status st;
    if (write)
        CHECK(MPI_File_write_at_all(fh, 0, buf, n, MPI_INT, &st));
    else
        CHECK(MPI_File_read_at_all(fh, 0, buf, n, MPI_INT, &st));
    int got = -1;
    MPI_Get_count(&st, MPI_INT, &got);
    if (got != n) {
        fprintf(stderr, "seed: rank %d moved %d ints, not %d\n", rank, got, n);
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
}

/* Repeats the phase's call (at most iters times, or until budget_s is spent), timing each
 * between barriers; rank 0 prints the times line. Returns the first call's time, ms. */
static double timed(MPI_File fh, const struct phase *ph, int *buf, int n, int rank)
{
    double *ms = malloc(sizeof(double) * (size_t)ph->iters), spent = 0;
    double cpu0 = cpu_now();
    int done = 0;
    for (int go = 1; go && done < ph->iters;) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        call(fh, ph->write, buf, n, rank);
        double dt = MPI_Wtime() - t0, slowest = 0;
        MPI_Reduce(&dt, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        ms[done++] = slowest * 1e3;
        spent += slowest;
        /* Rank 0 decides, so every rank makes the same number of collective calls. */
        go = ph->budget_s <= 0 || spent < ph->budget_s;
        MPI_Bcast(&go, 1, MPI_INT, 0, MPI_COMM_WORLD);
    }
    double cpu = cpu_now() - cpu0, cpu_all = 0;
    MPI_Reduce(&cpu, &cpu_all, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        printf("seed: times phase=%s iters=%d ms=", ph->name, done);
        for (int i = 0; i < done; i++)
            printf("%s%.4f", i ? "," : "", ms[i]);
        printf(" cpu_s=%.4f\n", cpu_all);
        fflush(stdout);
    }
    double first = ms[0];
    free(ms);
    return first;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, p;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &p);
    if (argc < 3) {
        fprintf(stderr, "usage: seed FILE COUNT [ITERS [PHASE [KEY=VALUE ...]]]\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    long count = atol(argv[2]);
    int iters = argc > 3 ? atoi(argv[3]) : 1;
    const char *phase = argc > 4 ? argv[4] : "wr";
    if (iters < 1 || (strcmp(phase, "wr") && strcmp(phase, "w") && strcmp(phase, "r"))) {
        fprintf(stderr, "seed: ITERS must be >= 1 and PHASE wr, w or r\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    double budget_s = 0;
    MPI_Info info;
    MPI_Info_create(&info);
    for (int a = 5; a < argc; a++) {
        char *eq = strchr(argv[a], '=');
        if (!eq) {
            fprintf(stderr, "seed: %s is not KEY=VALUE\n", argv[a]);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        *eq = '\0';
        if (strcmp(argv[a], "seed_budget_s") == 0)
            budget_s = atof(eq + 1);
        else
            MPI_Info_set(info, argv[a], eq + 1);
    }
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
    CHECK(MPI_File_open(MPI_COMM_WORLD, argv[1], MPI_MODE_CREATE | MPI_MODE_RDWR, info, &fh));
    CHECK(MPI_File_set_errhandler(fh, MPI_ERRORS_RETURN));
    CHECK(MPI_File_set_view(fh, disp, MPI_INT, ft, "native", MPI_INFO_NULL));
    struct phase w = {"write", 1, strchr(phase, 'w') ? iters : 1, strchr(phase, 'w') ? budget_s : 0};
    struct phase r = {"read", 0, strchr(phase, 'r') ? iters : 1, strchr(phase, 'r') ? budget_s : 0};
    double t_write = timed(fh, &w, mine, n, rank);
    CHECK(MPI_File_sync(fh));
    double t_read = timed(fh, &r, back, n, rank);
    for (int i = 0; i < n; i++)
        if (back[i] != mine[i]) {
            fprintf(stderr, "seed: rank %d read int %d as %x, not %x\n", rank, i, back[i],
                    mine[i]);
            MPI_Abort(MPI_COMM_WORLD, 4);
        }
    MPI_Offset size;
    CHECK(MPI_File_get_size(fh, &size));
    CHECK(MPI_File_close(&fh));
    if (rank == 0)
        printf("seed: ok, %d ranks, %ld ints, file %lld bytes, write_at_all %.1f ms, "
               "read_at_all %.1f ms (slowest rank, first call)\n",
               p, (long)n * p, (long long)size, t_write, t_read);
    MPI_Info_free(&info);
    MPI_Type_free(&ft);
    MPI_Type_free(&vec);
    free(mine);
    free(back);
    MPI_Finalize();
    return 0;
}
