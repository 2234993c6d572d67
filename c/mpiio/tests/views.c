/* File views and memory types of every constructor, an unmodified MPI-IO program: each case
 * sets a view (subarray, darray, indexed, struct, hvector under dup, indexed_block,
 * hindexed_block) with a memory type (contiguous, vector, a negative lower bound, a named
 * type with a hole), writes collectively into its own region of the file, and after a
 * sync reads it back through the same view. Run on a local path (ROMIO) and on a ferry://
 * URL (LD_PRELOAD=libferry-mpiio.so) the files must be byte-identical.
 *   mpirun -np 2 ./views FILE */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REGION (64 * 1024)
#define CASES 8

static void check(int rc, const char *what)
{
    if (rc != MPI_SUCCESS) {
        char s[MPI_MAX_ERROR_STRING];
        int l;
        MPI_Error_string(rc, s, &l);
        fprintf(stderr, "views: %s failed: %s\n", what, s);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
}

struct view {
    MPI_Offset disp;
    MPI_Datatype etype, ft, mt;
    int count;      /* instances of mt */
    int origin;     /* bytes into the buffer where mt's displacement 0 lies */
    const char *name;
};

static struct view make(int c, int r, int p)
{
    struct view v = {c * (MPI_Offset)REGION, MPI_INT, MPI_INT, MPI_INT, 0, 0, ""};
    MPI_Datatype t, u;
    int psizes[2] = {0, 0};
    switch (c) {
    case 0: { /* 2-D block columns of a 16 x 4p array */
        int sizes[2] = {16, 4 * p}, sub[2] = {16, 4}, starts[2] = {0, 4 * r};
        MPI_Type_create_subarray(2, sizes, sub, starts, MPI_ORDER_C, MPI_INT, &v.ft);
        v.count = 64;
        v.name = "subarray";
        break;
    }
    case 1: { /* block x cyclic darray of a 4p x 6 array */
        int g[2] = {4 * p, 6}, d[2] = {MPI_DISTRIBUTE_BLOCK, MPI_DISTRIBUTE_CYCLIC},
            a[2] = {MPI_DISTRIBUTE_DFLT_DARG, 1};
        MPI_Dims_create(p, 2, psizes);
        MPI_Type_create_darray(p, r, 2, g, d, a, psizes, MPI_ORDER_C, MPI_INT, &v.ft);
        int size;
        MPI_Type_size(v.ft, &size);
        v.count = size / 4;
        v.name = "darray";
        break;
    }
    case 2: { /* indexed blocks 1, 2, 3 ints in tiles of 8p ints; memory: every other int */
        int bl[3] = {1, 2, 3}, dl[3] = {0, 2, 5};
        MPI_Type_indexed(3, bl, dl, MPI_INT, &t);
        MPI_Type_create_resized(t, 0, 8 * 4 * p, &v.ft);
        MPI_Type_free(&t);
        v.disp += 8 * 4 * r;
        MPI_Type_vector(12, 1, 2, MPI_INT, &v.mt);
        v.count = 1;
        v.name = "indexed / vector memory";
        break;
    }
    case 3: { /* struct {int at 0, double at 8} in tiles of 16p bytes, etype byte */
        int bl[2] = {1, 1};
        MPI_Aint dl[2] = {0, 8};
        MPI_Datatype ts[2] = {MPI_INT, MPI_DOUBLE};
        MPI_Type_create_struct(2, bl, dl, ts, &t);
        MPI_Type_create_resized(t, 0, 16 * p, &v.ft);
        MPI_Type_free(&t);
        v.etype = MPI_BYTE;
        v.disp += 16 * r;
        v.mt = MPI_BYTE;
        v.count = 12 * 5;
        v.name = "struct";
        break;
    }
    case 4: { /* dup of an hvector: 2 ints every 8p bytes; memory: negative lower bound */
        MPI_Type_create_hvector(4, 2, 8 * p, MPI_INT, &t);
        MPI_Type_dup(t, &u);
        MPI_Type_free(&t);
        MPI_Type_create_resized(u, 0, 32 * p, &v.ft);
        MPI_Type_free(&u);
        v.disp += 8 * r;
        int bl[1] = {8};
        MPI_Aint dl[1] = {-16};
        MPI_Type_create_hindexed(1, bl, dl, MPI_INT, &v.mt);
        v.origin = 16;
        v.count = 2;
        v.name = "dup(hvector) / negative lb memory";
        break;
    }
    case 5: { /* indexed_block: ints 0, p, 2p of tiles of 3p ints */
        int dl[3] = {0, p, 2 * p};
        MPI_Type_create_indexed_block(3, 1, dl, MPI_INT, &t);
        MPI_Type_create_resized(t, 0, 3 * 4 * p, &v.ft);
        MPI_Type_free(&t);
        v.disp += 4 * r;
        v.count = 9;
        v.name = "indexed_block";
        break;
    }
    case 6: { /* hindexed_block: pairs of ints at byte 0 and 16p of tiles of 32p bytes */
        MPI_Aint dl[2] = {0, 16 * p};
        MPI_Type_create_hindexed_block(2, 2, dl, MPI_INT, &t);
        MPI_Type_create_resized(t, 0, 32 * p, &v.ft);
        MPI_Type_free(&t);
        v.disp += 8 * r;
        v.count = 12;
        v.name = "hindexed_block";
        break;
    }
    default: { /* a named type with a hole (MPI_SHORT_INT: 6 bytes in 8) in bytes */
        v.etype = v.ft = MPI_BYTE;
        v.disp += 24 * r;
        v.mt = MPI_SHORT_INT;
        v.count = 4;
        v.name = "named with a hole (MPI_SHORT_INT)";
        break;
    }
    }
    if (v.ft != MPI_BYTE && v.ft != MPI_INT)
        MPI_Type_commit(&v.ft);
    if (v.mt != MPI_INT && v.mt != MPI_BYTE && v.mt != MPI_SHORT_INT)
        MPI_Type_commit(&v.mt);
    return v;
}

static MPI_File handled_file;
static int handled;

static void on_error(MPI_File *fh, int *code, ...)
{
    int cls;
    MPI_Error_class(*code, &cls);
    if (*fh == handled_file && cls == MPI_ERR_UNSUPPORTED_OPERATION)
        handled++;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int r, p;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    MPI_Comm_size(MPI_COMM_WORLD, &p);
    if (argc < 2) {
        fprintf(stderr, "usage: views FILE\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_File fh;
    check(MPI_File_open(MPI_COMM_WORLD, argv[1], MPI_MODE_CREATE | MPI_MODE_RDWR, MPI_INFO_NULL, &fh), "open");
    check(MPI_File_set_errhandler(fh, MPI_ERRORS_RETURN), "set_errhandler");
    enum { BUF = 4096 };
    unsigned char src[CASES][BUF], want[BUF], got[BUF];
    /* argv[2], if given: a bit mask of the cases to run. */
    long mask = argc > 2 ? strtol(argv[2], NULL, 0) : (1L << CASES) - 1;
    for (int c = 0; c < CASES; c++) {
        if (!(mask >> c & 1))
            continue;
        struct view v = make(c, r, p);
        for (int i = 0; i < BUF; i++)
            src[c][i] = (unsigned char)(i * 7 + c * 31 + r * 101 + 1);
        check(MPI_File_set_view(fh, v.disp, v.etype, v.ft, "native", MPI_INFO_NULL), v.name);
        check(MPI_File_write_at_all(fh, 0, src[c] + v.origin, v.count, v.mt, MPI_STATUS_IGNORE), v.name);
        if (v.ft != MPI_BYTE && v.ft != MPI_INT)
            MPI_Type_free(&v.ft);
        if (v.mt != MPI_INT && v.mt != MPI_BYTE && v.mt != MPI_SHORT_INT)
            MPI_Type_free(&v.mt);
    }
    check(MPI_File_sync(fh), "sync");
    MPI_Barrier(MPI_COMM_WORLD);
    int bad = 0;
    for (int c = 0; c < CASES; c++) {
        if (!(mask >> c & 1))
            continue;
        struct view v = make(c, r, p);
        check(MPI_File_set_view(fh, v.disp, v.etype, v.ft, "native", MPI_INFO_NULL), v.name);
        memset(got, 0, BUF);
        MPI_Status st;
        check(MPI_File_read_at_all(fh, 0, got + v.origin, v.count, v.mt, &st), v.name);
        /* What the memory type covers of the source, by packing it and unpacking it into
         * zeros. */
        int psize, pos = 0;
        MPI_Pack_size(v.count, v.mt, MPI_COMM_SELF, &psize);
        unsigned char *packed = malloc((size_t)psize);
        MPI_Pack(src[c] + v.origin, v.count, v.mt, packed, psize, &pos, MPI_COMM_SELF);
        memset(want, 0, BUF);
        int upos = 0;
        MPI_Unpack(packed, pos, &upos, want + v.origin, v.count, v.mt, MPI_COMM_SELF);
        free(packed);
        if (memcmp(want, got, BUF) != 0) {
            fprintf(stderr, "views: rank %d case %s read back other bytes\n", r, v.name);
            bad = 1;
        }
        if (v.ft != MPI_BYTE && v.ft != MPI_INT)
            MPI_Type_free(&v.ft);
        if (v.mt != MPI_INT && v.mt != MPI_BYTE && v.mt != MPI_SHORT_INT)
            MPI_Type_free(&v.mt);
    }
    /* A user error handler gets the file and the code (MPI_File_set_atomicity(1) is
     * refused by ferry; Open MPI's own MPI-IO accepts it and calls nothing). */
    MPI_Errhandler eh;
    check(MPI_File_create_errhandler(on_error, &eh), "create_errhandler");
    check(MPI_File_set_errhandler(fh, eh), "set_errhandler");
    handled_file = fh;
    if (MPI_File_set_atomicity(fh, 1) != MPI_SUCCESS && handled == 1 && r == 0)
        printf("views: the user error handler was called\n");
    check(MPI_File_set_errhandler(fh, MPI_ERRORS_RETURN), "set_errhandler");
    MPI_Errhandler_free(&eh);
    check(MPI_File_close(&fh), "close");
    int any;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (r == 0 && !any)
        printf("views: ok, %d ranks, %d cases\n", p, CASES);
    MPI_Finalize();
    return any ? 5 : 0;
}
