/* libferry-mpiio.so: an MPI-IO interposer (LD_PRELOAD, or linked before libmpi) that
 * sends the files named ferry://host[:port]/root/path to a ferry server's collective I/O
 * face (ECIO: each rank's pieces go straight to the server with its view; no two-phase
 * redistribution among ranks) and forwards every other file to PMPI_File_*.
 *
 * - A ferry file is a struct ferry_file handed out as the MPI_File (Open MPI's MPI_File is
 *   a pointer); every MPI_File_* entry checks the table of live ferry files first, so a
 *   ferry handle never reaches libmpi. Fortran handles (c2f/f2c) are FINT_BASE + slot.
 * - MPI datatypes are decoded with MPI_Type_get_envelope / get_contents into ferry's
 *   constructor tree (ferry/cio.h): named, dup, contiguous, vector, hvector, indexed,
 *   hindexed, indexed_block, hindexed_block, struct, subarray, resized; darray, named
 *   types with holes and any other combiner are flattened by unpacking a numbered stream
 *   (exact; bounded by FLAT_LIMIT bytes of true extent). Memory types are decoded the same
 *   way and the client packs from the caller's buffer: no MPI_Pack copy.
 * - Errors go through the file's error handler with an error code of the right MPI class
 *   whose string (MPI_Error_string) is ferry's message.
 *
 * Hints (MPI_Info): ferry_url (the file's ferry URL, for programs that cannot change the
 * name), ferry_token (else $FERRY_TOKEN), ferry_mode (ecio, the default, or independent:
 * collective calls move each rank's data on its own), ferry_pipeline (write pipelining:
 * off, on, CALLS or CALLS,BYTES; else $FERRY_CIO_PIPELINE, on by default), ferry_read_cache
 * (the client's read cache: off, on or a size; else $FERRY_CIO_READ_CACHE, off by default).
 * cb_*, romio_* and every other hint are accepted and ignored. The guide is docs/cio.md. */

#define _GNU_SOURCE
#include <dlfcn.h>
#include <mpi.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include <ferry/cio.h>

#define FERRY_MAGIC 0x79727265u  /* "erry" */
#define FINT_BASE (1 << 28)
#define DEFAULT_PORT "7370"
#define MAX_DEPTH 64
/* The largest true extent a type flattened by unpacking may have (it needs about five
 * bytes of scratch memory per byte of it). */
#define FLAT_LIMIT ((MPI_Aint)64 << 20)

struct ferry_file {
    uint32_t magic;
    ferry_cio_file *cf;
    MPI_Comm comm;
    int amode;
    int independent;      /* ferry_mode=independent */
    int atomic;
    MPI_Info info;        /* the hints in use, for MPI_File_get_info */
    MPI_Errhandler eh;
    MPI_Offset disp;
    MPI_Datatype etype, filetype; /* dups of the view's types (named types as they are) */
    MPI_Offset etype_size;
    MPI_Offset pos;       /* the individual file pointer, in etypes */
    int slot;
    int split_rc;         /* the result of a split collective's begin, for its end */
    MPI_Count split_bytes;
};

/* ---- the table of live ferry files ---- */

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ferry_file **table;
static int table_len;

static struct ferry_file *lookup(MPI_File fh)
{
    struct ferry_file *hit = NULL;
    pthread_mutex_lock(&table_lock);
    for (int i = 0; i < table_len && !hit; i++)
        if (table[i] && (MPI_File)table[i] == fh)
            hit = table[i];
    pthread_mutex_unlock(&table_lock);
    return hit;
}

static int table_add(struct ferry_file *f)
{
    int rc = -1;
    pthread_mutex_lock(&table_lock);
    for (int i = 0; i < table_len; i++)
        if (!table[i]) {
            table[i] = f;
            rc = i;
            break;
        }
    if (rc < 0) {
        int n = table_len ? 2 * table_len : 16;
        struct ferry_file **t = realloc(table, (size_t)n * sizeof *t);
        if (t) {
            memset(t + table_len, 0, (size_t)(n - table_len) * sizeof *t);
            table = t;
            rc = table_len;
            table[rc] = f;
            table_len = n;
        }
    }
    pthread_mutex_unlock(&table_lock);
    return rc;
}

static void table_remove(struct ferry_file *f)
{
    pthread_mutex_lock(&table_lock);
    if (f->slot >= 0 && f->slot < table_len && table[f->slot] == f)
        table[f->slot] = NULL;
    pthread_mutex_unlock(&table_lock);
}

/* ---- errors ---- */

/* User error handlers made with MPI_File_create_errhandler, to call them for ferry files
 * (libmpi cannot: it never sees the handle). */
struct eh_fn {
    MPI_Errhandler eh;
    MPI_File_errhandler_function *fn;
};
static struct eh_fn eh_fns[64];
static int eh_fns_len;

/* One error code per MPI error class, its string replaced by each failure's message. */
static int class_codes[MPI_ERR_LASTCODE + 1];

static int ferry_to_mpi_class(int c)
{
    switch (c) {
    case FERRY_CIO_E_ARG: return MPI_ERR_ARG;
    case FERRY_CIO_E_TYPE: return MPI_ERR_TYPE;
    case FERRY_CIO_E_AMODE: return MPI_ERR_AMODE;
    case FERRY_CIO_E_ACCESS: return MPI_ERR_ACCESS;
    case FERRY_CIO_E_NO_SUCH_FILE: return MPI_ERR_NO_SUCH_FILE;
    case FERRY_CIO_E_FILE_EXISTS: return MPI_ERR_FILE_EXISTS;
    case FERRY_CIO_E_BAD_FILE: return MPI_ERR_BAD_FILE;
    case FERRY_CIO_E_IO: return MPI_ERR_IO;
    case FERRY_CIO_E_NO_SPACE: return MPI_ERR_NO_SPACE;
    case FERRY_CIO_E_READ_ONLY: return MPI_ERR_READ_ONLY;
    case FERRY_CIO_E_NOT_SAME: return MPI_ERR_NOT_SAME;
    case FERRY_CIO_E_UNSUPPORTED: return MPI_ERR_UNSUPPORTED_OPERATION;
    default: return MPI_ERR_OTHER;
    }
}

/* An error code of MPI class `cls` saying `msg` (the class itself if MPI has no room for
 * a code of its own). */
static int error_code(int cls, const char *msg)
{
    char text[MPI_MAX_ERROR_STRING];
    int code = cls;
    snprintf(text, sizeof text, "ferry: %s", msg);
    if (cls > 0 && cls <= MPI_ERR_LASTCODE) {
        if (!class_codes[cls] && PMPI_Add_error_code(cls, &class_codes[cls]) != MPI_SUCCESS)
            class_codes[cls] = 0;
        if (class_codes[cls]) {
            code = class_codes[cls];
            PMPI_Add_error_string(code, text);
        }
    }
    if (getenv("FERRY_MPIIO_VERBOSE"))
        fprintf(stderr, "ferry-mpiio: %s\n", msg);
    return code;
}

/* Calls error handler `eh` for `code` (on file `fh`, of communicator `comm`) and returns
 * the code, as MPI does for a handler that returns. */
static int raise_on(MPI_Errhandler eh, MPI_File fh, MPI_Comm comm, int code)
{
    if (eh == MPI_ERRORS_RETURN || eh == MPI_ERRHANDLER_NULL)
        return code;
    if (eh == MPI_ERRORS_ARE_FATAL) {
        char text[MPI_MAX_ERROR_STRING];
        int len = 0;
        PMPI_Error_string(code, text, &len);
        fprintf(stderr, "ferry-mpiio: MPI_ERRORS_ARE_FATAL: %s\n", text);
        PMPI_Abort(comm == MPI_COMM_NULL ? MPI_COMM_WORLD : comm, code);
        return code;
    }
    for (int i = 0; i < eh_fns_len; i++)
        if (eh_fns[i].eh == eh) {
            eh_fns[i].fn(&fh, &code);
            break;
        }
    return code;
}

/* The failure `msg` of class `cls` on ferry file `f`, through its error handler. */
static int fail(struct ferry_file *f, int cls, const char *msg)
{
    return raise_on(f->eh, (MPI_File)f, f->comm, error_code(cls, msg));
}

/* A ferry call's failure (ferry class `fc`, message from the library) on `f`. */
static int fail_ferry(struct ferry_file *f, int fc)
{
    return fail(f, ferry_to_mpi_class(fc), ferry_cio_last_error());
}

/* A collective call this rank cannot make (a memory type it cannot decode, which other
 * ranks may well decode) would leave the others waiting for it until the server's
 * collective_timeout: the rank leaves the session instead (its connection ends), so their
 * calls fail at once (MPI_ERR_OTHER). The file is unusable afterwards: close it. */
static int fail_collective(struct ferry_file *f, int cls, const char *msg)
{
    ferry_cio_abandon(f->cf);
    f->cf = NULL;
    return fail(f, cls, msg);
}

/* The failure of a call on a file whose session ended. */
#define LIVE_OR_FAIL(f)                                                                      \
    do {                                                                                     \
        if (!(f)->cf)                                                                        \
            return fail((f), MPI_ERR_OTHER, "this file left its session after a failed "    \
                                            "collective call: close it");                    \
    } while (0)

/* A failure without a file (open, delete): the handler of MPI_FILE_NULL, as MPI says. */
static int fail_nofile(MPI_Comm comm, int cls, const char *msg)
{
    MPI_Errhandler eh = MPI_ERRORS_RETURN;
    int code = error_code(cls, msg);
    PMPI_File_get_errhandler(MPI_FILE_NULL, &eh);
    code = raise_on(eh, MPI_FILE_NULL, comm, code);
    if (eh != MPI_ERRORS_RETURN && eh != MPI_ERRORS_ARE_FATAL)
        PMPI_Errhandler_free(&eh);
    return code;
}

/* ---- datatypes ---- */

static ferry_dt *decode(MPI_Datatype t, int depth, char *err, size_t errlen);

/* Flattens any type exactly by unpacking a numbered stream into scratch memory: each byte
 * of the stream is written where the type map puts it, so reading back the numbers (one
 * base-256 digit per pass) gives every byte's place. Runs of bytes that follow each other
 * in both the stream and memory become the blocks of an hindexed of bytes, resized to the
 * type's bounds. */
static ferry_dt *flatten_by_unpack(MPI_Datatype t, char *err, size_t errlen)
{
    MPI_Count size;
    MPI_Aint lb, ext, tlb, text;
    PMPI_Type_size_x(t, &size);
    PMPI_Type_get_extent(t, &lb, &ext);
    PMPI_Type_get_true_extent(t, &tlb, &text);
    if (size == 0)
        return ferry_dt_resized(ferry_dt_primitive(0), lb, ext);
    if (text > FLAT_LIMIT || size > text || size > INT32_MAX) {
        snprintf(err, errlen,
                 "a datatype ferry flattens (darray, or a named type with holes) spans %lld "
                 "bytes; at most %lld are supported",
                 (long long)text, (long long)FLAT_LIMIT);
        return NULL;
    }
    unsigned char *mem = calloc((size_t)text, 1), *stream = malloc((size_t)size);
    uint32_t *num = calloc((size_t)text, sizeof *num);
    int64_t *at = malloc((size_t)size * sizeof *at);
    uint64_t *bl = malloc((size_t)size * sizeof *bl);
    int64_t *dl = malloc((size_t)size * sizeof *dl);
    ferry_dt *out = NULL;
    if (!mem || !stream || !num || !at || !bl || !dl) {
        snprintf(err, errlen, "out of memory flattening a datatype");
        goto done;
    }
    char *origin = (char *)mem - tlb;
    /* Pass 0 marks the bytes written (1), passes 1..4 write digit d-1 of each number. */
    for (int pass = 0; pass <= 4; pass++) {
        if (pass > 1 && ((size - 1) >> (8 * (pass - 1))) == 0)
            break;
        for (MPI_Count i = 0; i < size; i++)
            stream[i] = pass == 0 ? 1 : (unsigned char)((uint64_t)i >> (8 * (pass - 1)));
        memset(mem, 0, (size_t)text);
        int position = 0;
        if (PMPI_Unpack(stream, (int)size, &position, origin, 1, t, MPI_COMM_SELF) != MPI_SUCCESS) {
            snprintf(err, errlen, "MPI_Unpack refused a datatype ferry flattens");
            goto done;
        }
        for (MPI_Aint j = 0; j < text; j++) {
            if (pass == 0)
                num[j] = mem[j] ? 0 : UINT32_MAX;
            else if (num[j] != UINT32_MAX)
                num[j] |= (uint32_t)mem[j] << (8 * (pass - 1));
        }
    }
    for (MPI_Count i = 0; i < size; i++)
        at[i] = -1;
    MPI_Count written = 0;
    for (MPI_Aint j = 0; j < text; j++)
        if (num[j] != UINT32_MAX && num[j] < (uint64_t)size && at[num[j]] < 0) {
            at[num[j]] = tlb + j;
            written++;
        }
    if (written != size) {
        snprintf(err, errlen, "a datatype whose pieces overlap in memory cannot be flattened");
        goto done;
    }
    size_t n = 0;
    for (MPI_Count i = 0; i < size; i++) {
        if (n && dl[n - 1] + (int64_t)bl[n - 1] == at[i])
            bl[n - 1]++;
        else {
            dl[n] = at[i];
            bl[n] = 1;
            n++;
        }
    }
    ferry_dt *byte = ferry_dt_primitive(1);
    ferry_dt *runs = ferry_dt_indexed(n, bl, dl, 1, byte);
    out = runs ? ferry_dt_resized(runs, lb, ext) : NULL;
    ferry_dt_free(runs);
    ferry_dt_free(byte);
done:
    free(mem);
    free(stream);
    free(num);
    free(at);
    free(bl);
    free(dl);
    return out;
}

static ferry_dt *decode_named(MPI_Datatype t, char *err, size_t errlen)
{
    MPI_Count size;
    MPI_Aint lb, ext, tlb, text;
    PMPI_Type_size_x(t, &size);
    PMPI_Type_get_extent(t, &lb, &ext);
    PMPI_Type_get_true_extent(t, &tlb, &text);
    if (lb == 0 && tlb == 0 && ext == size && text == size)
        return ferry_dt_primitive((uint64_t)size);
    return flatten_by_unpack(t, err, errlen); /* MPI_SHORT_INT and other pairs with holes */
}

static int is_named(MPI_Datatype t)
{
    int ni, na, nd, comb;
    return PMPI_Type_get_envelope(t, &ni, &na, &nd, &comb) == MPI_SUCCESS &&
           comb == MPI_COMBINER_NAMED;
}

/* Builds ferry's type for combiner `comb` from its contents and decoded children. */
static ferry_dt *build(int comb, const int *in, const MPI_Aint *ad, ferry_dt **kids, int nd,
                       char *err, size_t errlen)
{
    size_t n;
    uint64_t *u = NULL, *u2 = NULL, *u3 = NULL;
    int64_t *s = NULL;
    ferry_dt *r = NULL;
    switch (comb) {
    case MPI_COMBINER_DUP:
        return ferry_dt_contiguous(1, kids[0]);
    case MPI_COMBINER_CONTIGUOUS:
        return ferry_dt_contiguous((uint64_t)in[0], kids[0]);
    case MPI_COMBINER_VECTOR:
        return ferry_dt_vector((uint64_t)in[0], (uint64_t)in[1], in[2], 0, kids[0]);
    case MPI_COMBINER_HVECTOR:
        return ferry_dt_vector((uint64_t)in[0], (uint64_t)in[1], ad[0], 1, kids[0]);
    case MPI_COMBINER_RESIZED:
        return ferry_dt_resized(kids[0], ad[0], ad[1]);
    case MPI_COMBINER_INDEXED:
    case MPI_COMBINER_HINDEXED:
    case MPI_COMBINER_STRUCT:
        n = (size_t)in[0];
        u = malloc((n + 1) * sizeof *u);
        s = malloc((n + 1) * sizeof *s);
        if (!u || !s)
            break;
        for (size_t i = 0; i < n; i++) {
            u[i] = (uint64_t)in[1 + i];
            s[i] = comb == MPI_COMBINER_INDEXED ? in[1 + n + i] : ad[i];
        }
        if (comb == MPI_COMBINER_STRUCT)
            r = ferry_dt_struct(n, u, s, (const ferry_dt *const *)kids);
        else
            r = ferry_dt_indexed(n, u, s, comb == MPI_COMBINER_HINDEXED, kids[0]);
        break;
    case MPI_COMBINER_INDEXED_BLOCK:
    case MPI_COMBINER_HINDEXED_BLOCK:
        n = (size_t)in[0];
        s = malloc((n + 1) * sizeof *s);
        if (!s)
            break;
        for (size_t i = 0; i < n; i++)
            s[i] = comb == MPI_COMBINER_INDEXED_BLOCK ? in[2 + i] : ad[i];
        r = ferry_dt_indexed_block(n, (uint64_t)in[1], s, comb == MPI_COMBINER_HINDEXED_BLOCK,
                                   kids[0]);
        break;
    case MPI_COMBINER_SUBARRAY:
        n = (size_t)in[0];
        u = malloc((n + 1) * sizeof *u);
        u2 = malloc((n + 1) * sizeof *u2);
        u3 = malloc((n + 1) * sizeof *u3);
        if (!u || !u2 || !u3)
            break;
        for (size_t i = 0; i < n; i++) {
            u[i] = (uint64_t)in[1 + i];
            u2[i] = (uint64_t)in[1 + n + i];
            u3[i] = (uint64_t)in[1 + 2 * n + i];
        }
        r = ferry_dt_subarray(n, u, u2, u3, in[1 + 3 * n] == MPI_ORDER_C, kids[0]);
        break;
    default:
        snprintf(err, errlen, "datatype combiner %d is not supported", comb);
        return NULL;
    }
    (void)nd;
    if (!r && !err[0])
        snprintf(err, errlen, "%s", (u || s) ? ferry_cio_last_error() : "out of memory");
    free(u);
    free(u2);
    free(u3);
    free(s);
    return r;
}

/* ferry's description of MPI datatype `t`, or NULL with the reason in `err`. */
static ferry_dt *decode(MPI_Datatype t, int depth, char *err, size_t errlen)
{
    int ni, na, nd, comb;
    if (depth > MAX_DEPTH) {
        snprintf(err, errlen, "a datatype nests deeper than %d constructors", MAX_DEPTH);
        return NULL;
    }
    if (t == MPI_DATATYPE_NULL) {
        snprintf(err, errlen, "MPI_DATATYPE_NULL");
        return NULL;
    }
    if (PMPI_Type_get_envelope(t, &ni, &na, &nd, &comb) != MPI_SUCCESS) {
        snprintf(err, errlen, "MPI_Type_get_envelope failed: not a datatype");
        return NULL;
    }
    if (comb == MPI_COMBINER_NAMED)
        return decode_named(t, err, errlen);
    switch (comb) {
    case MPI_COMBINER_DUP: case MPI_COMBINER_CONTIGUOUS: case MPI_COMBINER_VECTOR:
    case MPI_COMBINER_HVECTOR: case MPI_COMBINER_INDEXED: case MPI_COMBINER_HINDEXED:
    case MPI_COMBINER_INDEXED_BLOCK: case MPI_COMBINER_HINDEXED_BLOCK:
    case MPI_COMBINER_STRUCT: case MPI_COMBINER_SUBARRAY: case MPI_COMBINER_RESIZED:
        break;
    default: /* darray, the F90 types and anything newer: exact, bounded */
        return flatten_by_unpack(t, err, errlen);
    }
    int *in = malloc(((size_t)ni + 1) * sizeof *in);
    MPI_Aint *ad = malloc(((size_t)na + 1) * sizeof *ad);
    MPI_Datatype *ts = malloc(((size_t)nd + 1) * sizeof *ts);
    ferry_dt **kids = calloc((size_t)nd + 1, sizeof *kids);
    ferry_dt *r = NULL;
    int got = 0;
    if (!in || !ad || !ts || !kids) {
        snprintf(err, errlen, "out of memory decoding a datatype");
        goto done;
    }
    if (PMPI_Type_get_contents(t, ni, na, nd, in, ad, ts) != MPI_SUCCESS) {
        snprintf(err, errlen, "MPI_Type_get_contents failed");
        goto done;
    }
    got = 1;
    for (int i = 0; i < nd; i++)
        if (!(kids[i] = decode(ts[i], depth + 1, err, errlen)))
            goto done;
    r = build(comb, in, ad, kids, nd, err, errlen);
done:
    for (int i = 0; got && i < nd; i++) {
        ferry_dt_free(kids[i]);
        if (!is_named(ts[i]))
            PMPI_Type_free(&ts[i]);
    }
    free(in);
    free(ad);
    free(ts);
    free(kids);
    return r;
}

/* ---- names and hints ---- */

/* The hint `key` of `info` into `val` (NUL-terminated), or 0. */
static int hint(MPI_Info info, const char *key, char *val, int len)
{
    int flag = 0;
    if (info == MPI_INFO_NULL)
        return 0;
    PMPI_Info_get(info, key, len - 1, val, &flag);
    return flag;
}

/* The ferry URL of a file named `name` with hints `info` into `url`, or 0 if it is not a
 * ferry file: a name ferry://... or ferry+DRIVER://..., or the hint ferry_url. */
static int ferry_url(const char *name, MPI_Info info, char *url, size_t len)
{
    if (name && strncmp(name, "ferry", 5) == 0 && (name[5] == ':' || name[5] == '+') &&
        strstr(name, "://")) {
        snprintf(url, len, "%s", name);
        return 1;
    }
    char v[1024];
    if (hint(info, "ferry_url", v, sizeof v)) {
        snprintf(url, len, "%s", v);
        return 1;
    }
    return 0;
}

/* Splits a ferry URL into the server's fabric address and the path (root/relative): 
 * ferry://host[:port]/p is tcp://host:port, ferry+DRIVER://where/p is DRIVER://where. */
static int split_url(const char *url, char *addr, size_t alen, char *path, size_t plen)
{
    const char *sep = strstr(url, "://");
    if (!sep || strncmp(url, "ferry", 5) != 0)
        return -1;
    const char *driver = url[5] == '+' ? url + 6 : "tcp://";
    size_t dlen = url[5] == '+' ? (size_t)(sep - driver) : 3;
    const char *where = sep + 3, *slash = strchr(where, '/');
    if (!slash || slash == where || !slash[1] || dlen == 0)
        return -1;
    size_t wlen = (size_t)(slash - where);
    const char *close = memchr(where, ']', wlen);
    const char *colon = memchr(close ? close : where, ':', wlen - (size_t)((close ? close : where) - where));
    int needs_port = strncmp(driver, "ofi+shm", dlen) != 0 && !colon;
    snprintf(addr, alen, "%.*s://%.*s%s%s", (int)dlen, driver, (int)wlen, where,
             needs_port ? ":" : "", needs_port ? DEFAULT_PORT : "");
    snprintf(path, plen, "%s", slash + 1);
    return 0;
}

/* ---- open and close ---- */

int MPI_File_open(MPI_Comm comm, const char *filename, int amode, MPI_Info info, MPI_File *fh)
{
    char url[1024], addr[1024], path[1024], token[1024], mode[64], pipeline[64], cache[64];
    if (!ferry_url(filename, info, url, sizeof url))
        return PMPI_File_open(comm, filename, amode, info, fh);
    if (split_url(url, addr, sizeof addr, path, sizeof path) != 0) {
        char msg[1200];
        snprintf(msg, sizeof msg, "%s is not a ferry URL (ferry://host[:port]/root/path, "
                 "ferry+ofi+shm://name/root/path)", url);
        return fail_nofile(comm, MPI_ERR_BAD_FILE, msg);
    }
    const char *tok = hint(info, "ferry_token", token, sizeof token) ? token : getenv("FERRY_TOKEN");
    int independent = hint(info, "ferry_mode", mode, sizeof mode) && strcmp(mode, "independent") == 0;
    int rank, size;
    PMPI_Comm_rank(comm, &rank);
    PMPI_Comm_size(comm, &size);
    /* The session id every rank of this open shares: rank 0 draws it. */
    uint64_t job = 0;
    if (rank == 0 && getrandom(&job, sizeof job, 0) != sizeof job)
        job = ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)&job;
    PMPI_Bcast(&job, 1, MPI_UINT64_T, 0, comm);

    ferry_cio_file *cf = NULL;
    int rc = ferry_cio_open(addr, path, job, (uint32_t)rank, (uint32_t)size, (uint32_t)amode,
                            tok, &cf, NULL);
    if (rc != 0)
        return fail_nofile(comm, ferry_to_mpi_class(rc), ferry_cio_last_error());
    /* A bad value fails the open on every rank that gave it (each leaves the session). */
    int pipelined = hint(info, "ferry_pipeline", pipeline, sizeof pipeline);
    if (pipelined && (rc = ferry_cio_set_pipeline(cf, pipeline)) != 0) {
        char msg[1200];
        snprintf(msg, sizeof msg, "hint ferry_pipeline: %s", ferry_cio_last_error());
        ferry_cio_abandon(cf);
        return fail_nofile(comm, ferry_to_mpi_class(rc), msg);
    }
    int cached = hint(info, "ferry_read_cache", cache, sizeof cache);
    if (cached && (rc = ferry_cio_set_read_cache(cf, cache)) != 0) {
        char msg[1200];
        snprintf(msg, sizeof msg, "hint ferry_read_cache: %s", ferry_cio_last_error());
        ferry_cio_abandon(cf);
        return fail_nofile(comm, ferry_to_mpi_class(rc), msg);
    }
    struct ferry_file *f = calloc(1, sizeof *f);
    if (!f) {
        ferry_cio_abandon(cf);
        return fail_nofile(comm, MPI_ERR_NO_MEM, "out of memory");
    }
    f->magic = FERRY_MAGIC;
    f->cf = cf;
    f->amode = amode;
    f->independent = independent;
    f->etype = f->filetype = MPI_BYTE;
    f->etype_size = 1;
    PMPI_Comm_dup(comm, &f->comm);
    PMPI_File_get_errhandler(MPI_FILE_NULL, &f->eh);
    PMPI_Info_create(&f->info);
    PMPI_Info_set(f->info, "ferry_url", url);
    PMPI_Info_set(f->info, "ferry_mode", independent ? "independent" : "ecio");
    if (pipelined)
        PMPI_Info_set(f->info, "ferry_pipeline", pipeline);
    if (cached)
        PMPI_Info_set(f->info, "ferry_read_cache", cache);
    f->slot = table_add(f);
    if (f->slot < 0) {
        ferry_cio_abandon(cf);
        free(f);
        return fail_nofile(comm, MPI_ERR_NO_MEM, "out of memory");
    }
    *fh = (MPI_File)f;
    return MPI_SUCCESS;
}

static void free_view_types(struct ferry_file *f)
{
    if (!is_named(f->etype))
        PMPI_Type_free(&f->etype);
    if (!is_named(f->filetype))
        PMPI_Type_free(&f->filetype);
}

int MPI_File_close(MPI_File *fh)
{
    struct ferry_file *f = fh ? lookup(*fh) : NULL;
    if (!f)
        return PMPI_File_close(fh);
    /* A file that left its session has nothing to close on the server. */
    int rc = f->cf ? ferry_cio_close(f->cf) : 0;
    f->cf = NULL;
    int code = rc ? error_code(ferry_to_mpi_class(rc), ferry_cio_last_error()) : MPI_SUCCESS;
    MPI_Errhandler eh = f->eh;
    MPI_Comm comm = f->comm;
    table_remove(f);
    free_view_types(f);
    PMPI_Info_free(&f->info);
    f->magic = 0;
    *fh = MPI_FILE_NULL;
    if (code != MPI_SUCCESS)
        code = raise_on(eh, MPI_FILE_NULL, comm, code);
    PMPI_Comm_free(&comm);
    free(f);
    return code;
}

/* Opens the ferry file `url` as a session of this process alone (for MPI_File_delete and
 * PnetCDF's format probe); 0, a ferry error class, or -1 for a name that is no ferry URL. */
static int open_alone(const char *url, MPI_Info info, int amode, ferry_cio_file **cf)
{
    char addr[1024], path[1024], token[1024];
    if (split_url(url, addr, sizeof addr, path, sizeof path) != 0)
        return -1;
    const char *tok = hint(info, "ferry_token", token, sizeof token) ? token : getenv("FERRY_TOKEN");
    uint64_t job = 0;
    if (getrandom(&job, sizeof job, 0) != sizeof job)
        job = ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)&job;
    return ferry_cio_open(addr, path, job, 0, 1, (uint32_t)amode, tok, cf, NULL);
}

int MPI_File_delete(const char *filename, MPI_Info info)
{
    char url[1024];
    if (!ferry_url(filename, info, url, sizeof url))
        return PMPI_File_delete(filename, info);
    /* The server removes a file opened with DELETE_ON_CLOSE when its session closes it. */
    ferry_cio_file *cf = NULL;
    int rc = open_alone(url, info, MPI_MODE_RDONLY | MPI_MODE_DELETE_ON_CLOSE, &cf);
    if (rc < 0)
        return fail_nofile(MPI_COMM_SELF, MPI_ERR_BAD_FILE,
                           "not a ferry URL (ferry://host[:port]/root/path)");
    if (rc == 0)
        rc = ferry_cio_close(cf);
    return rc ? fail_nofile(MPI_COMM_SELF, ferry_to_mpi_class(rc), ferry_cio_last_error())
              : MPI_SUCCESS;
}

/* ---- views ---- */

int MPI_File_set_view(MPI_File fh, MPI_Offset disp, MPI_Datatype etype, MPI_Datatype filetype,
                      const char *datarep, MPI_Info info)
{
    struct ferry_file *f = lookup(fh);
    if (!f)
        return PMPI_File_set_view(fh, disp, etype, filetype, datarep, info);
    if (datarep && strcmp(datarep, "native") != 0) {
        char msg[256];
        snprintf(msg, sizeof msg, "data representation \"%s\": ferry supports \"native\" only", datarep);
        return fail(f, MPI_ERR_UNSUPPORTED_DATAREP, msg);
    }
    if (disp == MPI_DISPLACEMENT_CURRENT)
        return fail(f, MPI_ERR_UNSUPPORTED_OPERATION,
                    "MPI_DISPLACEMENT_CURRENT (sequential mode) is not supported");
    LIVE_OR_FAIL(f);
    char err[512] = "";
    ferry_dt *e = decode(etype, 0, err, sizeof err);
    ferry_dt *t = e ? decode(filetype, 0, err, sizeof err) : NULL;
    if (!e || !t) {
        ferry_dt_free(e);
        return fail_collective(f, MPI_ERR_TYPE, err);
    }
    int rc = ferry_cio_set_view(f->cf, disp, e, t);
    ferry_dt_free(e);
    ferry_dt_free(t);
    if (rc)
        return fail_ferry(f, rc);
    free_view_types(f);
    f->etype = etype;
    f->filetype = filetype;
    if (!is_named(etype))
        PMPI_Type_dup(etype, &f->etype);
    if (!is_named(filetype))
        PMPI_Type_dup(filetype, &f->filetype);
    MPI_Count esize;
    PMPI_Type_size_x(etype, &esize);
    f->etype_size = esize;
    f->disp = disp;
    f->pos = 0;
    return MPI_SUCCESS;
}

int MPI_File_get_view(MPI_File fh, MPI_Offset *disp, MPI_Datatype *etype, MPI_Datatype *filetype,
                      char *datarep)
{
    struct ferry_file *f = lookup(fh);
    if (!f)
        return PMPI_File_get_view(fh, disp, etype, filetype, datarep);
    *disp = f->disp;
    *etype = f->etype;
    *filetype = f->filetype;
    /* Derived types are returned as new handles the caller frees, as MPI says. */
    if (!is_named(f->etype))
        PMPI_Type_dup(f->etype, etype);
    if (!is_named(f->filetype))
        PMPI_Type_dup(f->filetype, filetype);
    strcpy(datarep, "native");
    return MPI_SUCCESS;
}

/* ---- data ---- */

static void set_status(MPI_Status *st, MPI_Count bytes)
{
    if (st == MPI_STATUS_IGNORE)
        return;
    st->MPI_SOURCE = MPI_UNDEFINED;
    st->MPI_TAG = MPI_UNDEFINED;
    st->MPI_ERROR = MPI_SUCCESS;
    PMPI_Status_set_elements_x(st, MPI_BYTE, bytes);
    PMPI_Status_set_cancelled(st, 0);
}

/* Moves `count` of `dt` between `buf` and the file at `offset` etypes (the individual file
 * pointer, advanced, if `use_pos`), collectively or not. */
static int io(struct ferry_file *f, int write, int collective, int use_pos, MPI_Offset offset,
              const void *buf, int count, MPI_Datatype dt, MPI_Status *st, MPI_Count *moved)
{
    char err[512] = "";
    LIVE_OR_FAIL(f);
    if (use_pos)
        offset = f->pos;
    int coll = collective && !f->independent;
    if (offset < 0 || count < 0)
        return (coll ? fail_collective : fail)(f, MPI_ERR_ARG, "a negative offset or count");
    ferry_dt *mt = decode(dt, 0, err, sizeof err);
    if (!mt)
        return (coll ? fail_collective : fail)(f, MPI_ERR_TYPE, err);
    uint64_t done = 0;
    int rc = write ? ferry_cio_write(f->cf, coll, (uint64_t)offset, buf, (uint64_t)count, mt, &done)
                   : ferry_cio_read(f->cf, coll, (uint64_t)offset, (void *)buf, (uint64_t)count, mt, &done);
    ferry_dt_free(mt);
    if (rc)
        return fail_ferry(f, rc);
    if (use_pos)
        f->pos += (MPI_Offset)done / f->etype_size;
    set_status(st, (MPI_Count)done);
    if (moved)
        *moved = (MPI_Count)done;
    return MPI_SUCCESS;
}

#define IO_AT(NAME, WRITE, COLL, CONST)                                                     \
    int NAME(MPI_File fh, MPI_Offset offset, CONST void *buf, int count, MPI_Datatype dt,    \
             MPI_Status *st)                                                                 \
    {                                                                                        \
        struct ferry_file *f = lookup(fh);                                                   \
        if (!f)                                                                              \
            return P##NAME(fh, offset, buf, count, dt, st);                                  \
        return io(f, WRITE, COLL, 0, offset, buf, count, dt, st, NULL);                      \
    }
IO_AT(MPI_File_write_at, 1, 0, const)
IO_AT(MPI_File_write_at_all, 1, 1, const)
IO_AT(MPI_File_read_at, 0, 0, )
IO_AT(MPI_File_read_at_all, 0, 1, )

#define IO_POS(NAME, WRITE, COLL, CONST)                                                    \
    int NAME(MPI_File fh, CONST void *buf, int count, MPI_Datatype dt, MPI_Status *st)       \
    {                                                                                        \
        struct ferry_file *f = lookup(fh);                                                   \
        if (!f)                                                                              \
            return P##NAME(fh, buf, count, dt, st);                                          \
        return io(f, WRITE, COLL, 1, 0, buf, count, dt, st, NULL);                           \
    }
IO_POS(MPI_File_write, 1, 0, const)
IO_POS(MPI_File_write_all, 1, 1, const)
IO_POS(MPI_File_read, 0, 0, )
IO_POS(MPI_File_read_all, 0, 1, )

/* Non-blocking calls complete at once (the data has moved when they return) and hand out
 * a generalized request holding the byte count. */
static int greq_query(void *state, MPI_Status *st)
{
    set_status(st, *(MPI_Count *)state);
    return MPI_SUCCESS;
}
static int greq_free(void *state)
{
    free(state);
    return MPI_SUCCESS;
}
static int greq_cancel(void *state, int complete)
{
    (void)state;
    (void)complete;
    return MPI_SUCCESS;
}

static int io_request(struct ferry_file *f, int write, int coll, int use_pos, MPI_Offset offset,
                      const void *buf, int count, MPI_Datatype dt, MPI_Request *req)
{
    MPI_Count *moved = calloc(1, sizeof *moved);
    if (!moved)
        return fail(f, MPI_ERR_NO_MEM, "out of memory");
    int rc = io(f, write, coll, use_pos, offset, buf, count, dt, MPI_STATUS_IGNORE, moved);
    if (rc != MPI_SUCCESS) {
        free(moved);
        return rc;
    }
    PMPI_Grequest_start(greq_query, greq_free, greq_cancel, moved, req);
    PMPI_Grequest_complete(*req);
    return MPI_SUCCESS;
}

#define IIO_AT(NAME, WRITE, COLL, CONST)                                                    \
    int NAME(MPI_File fh, MPI_Offset offset, CONST void *buf, int count, MPI_Datatype dt,    \
             MPI_Request *req)                                                               \
    {                                                                                        \
        struct ferry_file *f = lookup(fh);                                                   \
        if (!f)                                                                              \
            return P##NAME(fh, offset, buf, count, dt, req);                                 \
        return io_request(f, WRITE, COLL, 0, offset, buf, count, dt, req);                   \
    }
IIO_AT(MPI_File_iwrite_at, 1, 0, const)
IIO_AT(MPI_File_iwrite_at_all, 1, 1, const)
IIO_AT(MPI_File_iread_at, 0, 0, )
IIO_AT(MPI_File_iread_at_all, 0, 1, )

#define IIO_POS(NAME, WRITE, COLL, CONST)                                                   \
    int NAME(MPI_File fh, CONST void *buf, int count, MPI_Datatype dt, MPI_Request *req)     \
    {                                                                                        \
        struct ferry_file *f = lookup(fh);                                                   \
        if (!f)                                                                              \
            return P##NAME(fh, buf, count, dt, req);                                         \
        return io_request(f, WRITE, COLL, 1, 0, buf, count, dt, req);                        \
    }
IIO_POS(MPI_File_iwrite, 1, 0, const)
IIO_POS(MPI_File_iwrite_all, 1, 1, const)
IIO_POS(MPI_File_iread, 0, 0, )
IIO_POS(MPI_File_iread_all, 0, 1, )

/* Split collectives: the begin call does the work, the end call reports it. */
#define SPLIT_AT_BEGIN(NAME, WRITE, CONST)                                                  \
    int NAME(MPI_File fh, MPI_Offset offset, CONST void *buf, int count, MPI_Datatype dt)     \
    {                                                                                        \
        struct ferry_file *f = lookup(fh);                                                   \
        if (!f)                                                                              \
            return P##NAME(fh, offset, buf, count, dt);                                      \
        f->split_bytes = 0;                                                                  \
        return f->split_rc = io(f, WRITE, 1, 0, offset, buf, count, dt, MPI_STATUS_IGNORE,   \
                                &f->split_bytes);                                            \
    }
SPLIT_AT_BEGIN(MPI_File_write_at_all_begin, 1, const)
SPLIT_AT_BEGIN(MPI_File_read_at_all_begin, 0, )

#define SPLIT_BEGIN(NAME, WRITE, CONST)                                                     \
    int NAME(MPI_File fh, CONST void *buf, int count, MPI_Datatype dt)                       \
    {                                                                                        \
        struct ferry_file *f = lookup(fh);                                                   \
        if (!f)                                                                              \
            return P##NAME(fh, buf, count, dt);                                              \
        f->split_bytes = 0;                                                                  \
        return f->split_rc = io(f, WRITE, 1, 1, 0, buf, count, dt, MPI_STATUS_IGNORE,        \
                                &f->split_bytes);                                            \
    }
SPLIT_BEGIN(MPI_File_write_all_begin, 1, const)
SPLIT_BEGIN(MPI_File_read_all_begin, 0, )

#define SPLIT_END(NAME, CONST)                                                              \
    int NAME(MPI_File fh, CONST void *buf, MPI_Status *st)                                   \
    {                                                                                        \
        struct ferry_file *f = lookup(fh);                                                   \
        if (!f)                                                                              \
            return P##NAME(fh, buf, st);                                                     \
        set_status(st, f->split_bytes);                                                      \
        return f->split_rc;                                                                  \
    }
SPLIT_END(MPI_File_write_at_all_end, const)
SPLIT_END(MPI_File_read_at_all_end, )
SPLIT_END(MPI_File_write_all_end, const)
SPLIT_END(MPI_File_read_all_end, )

/* ---- size, sync, pointers ---- */

int MPI_File_get_size(MPI_File fh, MPI_Offset *size)
{
    struct ferry_file *f = lookup(fh);
    if (!f)
        return PMPI_File_get_size(fh, size);
    LIVE_OR_FAIL(f);
    uint64_t n = 0;
    int rc = ferry_cio_get_size(f->cf, &n);
    if (rc)
        return fail_ferry(f, rc);
    *size = (MPI_Offset)n;
    return MPI_SUCCESS;
}

int MPI_File_set_size(MPI_File fh, MPI_Offset size)
{
    struct ferry_file *f = lookup(fh);
    if (!f)
        return PMPI_File_set_size(fh, size);
    if (size < 0)
        return fail(f, MPI_ERR_ARG, "a negative file size");
    LIVE_OR_FAIL(f);
    int rc = ferry_cio_set_size(f->cf, (uint64_t)size);
    return rc ? fail_ferry(f, rc) : MPI_SUCCESS;
}

int MPI_File_preallocate(MPI_File fh, MPI_Offset size)
{
    struct ferry_file *f = lookup(fh);
    if (!f)
        return PMPI_File_preallocate(fh, size);
    if (size < 0)
        return fail(f, MPI_ERR_ARG, "a negative file size");
    LIVE_OR_FAIL(f);
    int rc = ferry_cio_preallocate(f->cf, (uint64_t)size);
    return rc ? fail_ferry(f, rc) : MPI_SUCCESS;
}

int MPI_File_sync(MPI_File fh)
{
    struct ferry_file *f = lookup(fh);
    if (!f)
        return PMPI_File_sync(fh);
    LIVE_OR_FAIL(f);
    int rc = ferry_cio_sync(f->cf);
    return rc ? fail_ferry(f, rc) : MPI_SUCCESS;
}

/* The etype offset of the end of the file in the current view: whole tiles, plus the
 * part of the last tile's data before the end (taken as the tile's first bytes). */
static MPI_Offset end_in_etypes(struct ferry_file *f, MPI_Offset size)
{
    MPI_Aint lb, ext;
    MPI_Count tsize;
    PMPI_Type_get_extent(f->filetype, &lb, &ext);
    PMPI_Type_size_x(f->filetype, &tsize);
    MPI_Offset past = size > f->disp ? size - f->disp : 0;
    if (ext <= 0)
        return 0;
    MPI_Offset part = past % ext;
    MPI_Offset bytes = (past / ext) * tsize + (part < tsize ? part : tsize);
    return bytes / f->etype_size;
}

int MPI_File_seek(MPI_File fh, MPI_Offset offset, int whence)
{
    struct ferry_file *f = lookup(fh);
    if (!f)
        return PMPI_File_seek(fh, offset, whence);
    MPI_Offset base = 0;
    if (whence == MPI_SEEK_CUR)
        base = f->pos;
    else if (whence == MPI_SEEK_END) {
        LIVE_OR_FAIL(f);
        uint64_t n = 0;
        int rc = ferry_cio_get_size(f->cf, &n);
        if (rc)
            return fail_ferry(f, rc);
        base = end_in_etypes(f, (MPI_Offset)n);
    } else if (whence != MPI_SEEK_SET)
        return fail(f, MPI_ERR_ARG, "whence is not MPI_SEEK_SET, MPI_SEEK_CUR or MPI_SEEK_END");
    if (base + offset < 0)
        return fail(f, MPI_ERR_ARG, "the seek goes before the start of the view");
    f->pos = base + offset;
    return MPI_SUCCESS;
}

int MPI_File_get_position(MPI_File fh, MPI_Offset *offset)
{
    struct ferry_file *f = lookup(fh);
    if (!f)
        return PMPI_File_get_position(fh, offset);
    *offset = f->pos;
    return MPI_SUCCESS;
}

int MPI_File_get_byte_offset(MPI_File fh, MPI_Offset offset, MPI_Offset *disp)
{
    struct ferry_file *f = lookup(fh);
    if (!f)
        return PMPI_File_get_byte_offset(fh, offset, disp);
    if (offset < 0)
        return fail(f, MPI_ERR_ARG, "a negative offset");
    LIVE_OR_FAIL(f);
    uint64_t at = 0;
    int rc = ferry_cio_byte_offset(f->cf, (uint64_t)offset, &at);
    if (rc)
        return fail_ferry(f, rc);
    *disp = (MPI_Offset)at;
    return MPI_SUCCESS;
}

int MPI_File_get_type_extent(MPI_File fh, MPI_Datatype datatype, MPI_Aint *extent)
{
    struct ferry_file *f = lookup(fh);
    if (!f)
        return PMPI_File_get_type_extent(fh, datatype, extent);
    MPI_Aint lb;
    return PMPI_Type_get_extent(datatype, &lb, extent); /* native representation */
}

/* ---- properties ---- */

int MPI_File_get_amode(MPI_File fh, int *amode)
{
    struct ferry_file *f = lookup(fh);
    if (!f)
        return PMPI_File_get_amode(fh, amode);
    *amode = f->amode;
    return MPI_SUCCESS;
}

int MPI_File_get_group(MPI_File fh, MPI_Group *group)
{
    struct ferry_file *f = lookup(fh);
    if (!f)
        return PMPI_File_get_group(fh, group);
    return PMPI_Comm_group(f->comm, group);
}

int MPI_File_set_info(MPI_File fh, MPI_Info info)
{
    struct ferry_file *f = lookup(fh);
    if (!f)
        return PMPI_File_set_info(fh, info);
    (void)info; /* ROMIO / OMPIO hints mean nothing here; ferry's are read at open */
    return MPI_SUCCESS;
}

int MPI_File_get_info(MPI_File fh, MPI_Info *info_used)
{
    struct ferry_file *f = lookup(fh);
    if (!f)
        return PMPI_File_get_info(fh, info_used);
    return PMPI_Info_dup(f->info, info_used);
}

int MPI_File_set_atomicity(MPI_File fh, int flag)
{
    struct ferry_file *f = lookup(fh);
    if (!f)
        return PMPI_File_set_atomicity(fh, flag);
    if (flag)
        return fail(f, MPI_ERR_UNSUPPORTED_OPERATION,
                    "atomic mode is not supported by ferry's collective I/O (writes of one "
                    "collective call never overlap; use MPI_File_sync between conflicting "
                    "accesses)");
    f->atomic = 0;
    return MPI_SUCCESS;
}

int MPI_File_get_atomicity(MPI_File fh, int *flag)
{
    struct ferry_file *f = lookup(fh);
    if (!f)
        return PMPI_File_get_atomicity(fh, flag);
    *flag = f->atomic;
    return MPI_SUCCESS;
}

/* ---- error handlers ---- */

int MPI_File_create_errhandler(MPI_File_errhandler_function *function, MPI_Errhandler *errhandler)
{
    int rc = PMPI_File_create_errhandler(function, errhandler);
    if (rc == MPI_SUCCESS) {
        pthread_mutex_lock(&table_lock);
        if (eh_fns_len < (int)(sizeof eh_fns / sizeof eh_fns[0]))
            eh_fns[eh_fns_len++] = (struct eh_fn){*errhandler, function};
        pthread_mutex_unlock(&table_lock);
    }
    return rc;
}

int MPI_File_set_errhandler(MPI_File file, MPI_Errhandler errhandler)
{
    struct ferry_file *f = lookup(file);
    if (!f)
        return PMPI_File_set_errhandler(file, errhandler);
    f->eh = errhandler;
    return MPI_SUCCESS;
}

int MPI_File_get_errhandler(MPI_File file, MPI_Errhandler *errhandler)
{
    struct ferry_file *f = lookup(file);
    if (!f)
        return PMPI_File_get_errhandler(file, errhandler);
    *errhandler = f->eh;
    return MPI_SUCCESS;
}

int MPI_File_call_errhandler(MPI_File fh, int errorcode)
{
    struct ferry_file *f = lookup(fh);
    if (!f)
        return PMPI_File_call_errhandler(fh, errorcode);
    raise_on(f->eh, fh, f->comm, errorcode);
    return MPI_SUCCESS;
}

/* ---- Fortran handles ---- */

MPI_Fint MPI_File_c2f(MPI_File file)
{
    struct ferry_file *f = lookup(file);
    return f ? (MPI_Fint)(FINT_BASE + f->slot) : PMPI_File_c2f(file);
}

MPI_File MPI_File_f2c(MPI_Fint file)
{
    if (file >= FINT_BASE) {
        MPI_File hit = MPI_FILE_NULL;
        pthread_mutex_lock(&table_lock);
        if (file - FINT_BASE < table_len && table[file - FINT_BASE])
            hit = (MPI_File)table[file - FINT_BASE];
        pthread_mutex_unlock(&table_lock);
        return hit;
    }
    return PMPI_File_f2c(file);
}

/* ---- not supported for ferry files: shared file pointers, ordered access ---- */

static int unsupported(struct ferry_file *f, const char *call)
{
    char msg[256];
    snprintf(msg, sizeof msg, "%s is not supported on a ferry file (no shared file pointer)", call);
    return fail(f, MPI_ERR_UNSUPPORTED_OPERATION, msg);
}

#define UNSUP_RW(NAME, CONST)                                                               \
    int NAME(MPI_File fh, CONST void *buf, int count, MPI_Datatype dt, MPI_Status *st)       \
    {                                                                                        \
        struct ferry_file *f = lookup(fh);                                                   \
        return f ? unsupported(f, #NAME) : P##NAME(fh, buf, count, dt, st);                  \
    }
UNSUP_RW(MPI_File_read_shared, )
UNSUP_RW(MPI_File_write_shared, const)
UNSUP_RW(MPI_File_read_ordered, )
UNSUP_RW(MPI_File_write_ordered, const)

#define UNSUP_IRW(NAME, CONST)                                                              \
    int NAME(MPI_File fh, CONST void *buf, int count, MPI_Datatype dt, MPI_Request *req)     \
    {                                                                                        \
        struct ferry_file *f = lookup(fh);                                                   \
        return f ? unsupported(f, #NAME) : P##NAME(fh, buf, count, dt, req);                 \
    }
UNSUP_IRW(MPI_File_iread_shared, )
UNSUP_IRW(MPI_File_iwrite_shared, const)

#define UNSUP_BEGIN(NAME, CONST)                                                            \
    int NAME(MPI_File fh, CONST void *buf, int count, MPI_Datatype dt)                       \
    {                                                                                        \
        struct ferry_file *f = lookup(fh);                                                   \
        return f ? unsupported(f, #NAME) : P##NAME(fh, buf, count, dt);                      \
    }
UNSUP_BEGIN(MPI_File_read_ordered_begin, )
UNSUP_BEGIN(MPI_File_write_ordered_begin, const)

#define UNSUP_END(NAME, CONST)                                                              \
    int NAME(MPI_File fh, CONST void *buf, MPI_Status *st)                                   \
    {                                                                                        \
        struct ferry_file *f = lookup(fh);                                                   \
        return f ? unsupported(f, #NAME) : P##NAME(fh, buf, st);                             \
    }
UNSUP_END(MPI_File_read_ordered_end, )
UNSUP_END(MPI_File_write_ordered_end, const)

int MPI_File_seek_shared(MPI_File fh, MPI_Offset offset, int whence)
{
    struct ferry_file *f = lookup(fh);
    return f ? unsupported(f, "MPI_File_seek_shared") : PMPI_File_seek_shared(fh, offset, whence);
}

int MPI_File_get_position_shared(MPI_File fh, MPI_Offset *offset)
{
    struct ferry_file *f = lookup(fh);
    return f ? unsupported(f, "MPI_File_get_position_shared")
             : PMPI_File_get_position_shared(fh, offset);
}

/* ---- PnetCDF's format probe ---- */

/* PnetCDF (1.12) learns an existing file's format before MPI_File_open by reading its
 * first bytes with POSIX open() on rank 0 (ncmpi_inq_file_format, called through its
 * PLT). For a ferry file this answers from the server: one read of the 8-byte magic on a
 * session of this process alone. Every other name goes to PnetCDF's own function. The
 * values are pnetcdf.h's (not included: PnetCDF need not be installed to build this). */
enum {
    PNC_NOERR = 0, PNC_ENOTNC = -51, PNC_EFILE = -204, PNC_ENOENT = -220,
    PNC_FORMAT_UNKNOWN = -1, PNC_FORMAT_CLASSIC = 1, PNC_FORMAT_CDF2 = 2,
    PNC_FORMAT_NETCDF4 = 3, PNC_FORMAT_CDF5 = 5
};

int ncmpi_inq_file_format(const char *filename, int *formatp)
{
    char url[1024];
    if (!ferry_url(filename, MPI_INFO_NULL, url, sizeof url)) {
        int (*real)(const char *, int *) =
            (int (*)(const char *, int *))dlsym(RTLD_NEXT, "ncmpi_inq_file_format");
        return real ? real(filename, formatp) : PNC_EFILE;
    }
    ferry_cio_file *cf = NULL;
    int rc = open_alone(url, MPI_INFO_NULL, MPI_MODE_RDONLY, &cf);
    if (rc != 0)
        return rc == FERRY_CIO_E_NO_SUCH_FILE ? PNC_ENOENT : PNC_EFILE;
    unsigned char magic[8] = {0};
    uint64_t got = 0;
    ferry_dt *byte = ferry_dt_primitive(1);
    rc = ferry_cio_read(cf, 0, 0, magic, sizeof magic, byte, &got);
    ferry_dt_free(byte);
    ferry_cio_close(cf);
    if (rc != 0)
        return PNC_EFILE;
    *formatp = PNC_FORMAT_UNKNOWN;
    if (got >= 4 && memcmp(magic, "CDF", 3) == 0)
        *formatp = magic[3] == 1 ? PNC_FORMAT_CLASSIC
                   : magic[3] == 2 ? PNC_FORMAT_CDF2
                   : magic[3] == 5 ? PNC_FORMAT_CDF5 : PNC_FORMAT_UNKNOWN;
    else if (got >= 8 && memcmp(magic, "\211HDF\r\n\032\n", 8) == 0)
        *formatp = PNC_FORMAT_NETCDF4;
    return *formatp == PNC_FORMAT_UNKNOWN ? PNC_ENOTNC : PNC_NOERR;
}
