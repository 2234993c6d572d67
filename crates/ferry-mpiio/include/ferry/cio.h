/* ferry/cio.h: the C face of ferry's collective I/O client (crate ferry-mpiio, linked
 * into libferry-mpiio.so). Datatype constructors return a new handle or NULL; file calls
 * return 0 or a ferry error class (FERRY_CIO_E_*); either way ferry_cio_last_error() is
 * the failure's message on the calling thread. */
#ifndef FERRY_CIO_H
#define FERRY_CIO_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Error classes (the wire codes of ferry_cio::ErrorClass). */
enum {
    FERRY_CIO_E_ARG = 1, FERRY_CIO_E_TYPE = 2, FERRY_CIO_E_AMODE = 3, FERRY_CIO_E_ACCESS = 4,
    FERRY_CIO_E_NO_SUCH_FILE = 5, FERRY_CIO_E_FILE_EXISTS = 6, FERRY_CIO_E_BAD_FILE = 7,
    FERRY_CIO_E_IO = 8, FERRY_CIO_E_NO_SPACE = 9, FERRY_CIO_E_READ_ONLY = 10,
    FERRY_CIO_E_NOT_SAME = 11, FERRY_CIO_E_UNSUPPORTED = 12, FERRY_CIO_E_RANK_LOST = 13,
    FERRY_CIO_E_BUSY = 14, FERRY_CIO_E_VERSION = 15, FERRY_CIO_E_CONNECTION = 16
};

typedef struct FerryDt ferry_dt;
typedef struct FerryCioFile ferry_cio_file;

const char *ferry_cio_last_error(void);

ferry_dt *ferry_dt_primitive(uint64_t size);
ferry_dt *ferry_dt_contiguous(uint64_t count, const ferry_dt *old);
/* hbytes != 0: stride / displacements in bytes (the h* constructors). */
ferry_dt *ferry_dt_vector(uint64_t count, uint64_t blocklen, int64_t stride, int hbytes,
                          const ferry_dt *old);
ferry_dt *ferry_dt_indexed(size_t n, const uint64_t *blocklens, const int64_t *displs,
                           int hbytes, const ferry_dt *old);
ferry_dt *ferry_dt_indexed_block(size_t n, uint64_t blocklen, const int64_t *displs, int hbytes,
                                 const ferry_dt *old);
ferry_dt *ferry_dt_struct(size_t n, const uint64_t *blocklens, const int64_t *displs,
                          const ferry_dt *const *types);
ferry_dt *ferry_dt_resized(const ferry_dt *old, int64_t lb, int64_t extent);
ferry_dt *ferry_dt_subarray(size_t ndims, const uint64_t *sizes, const uint64_t *subsizes,
                            const uint64_t *starts, int order_c, const ferry_dt *old);
void ferry_dt_free(ferry_dt *t);
uint64_t ferry_dt_size(const ferry_dt *t);
int64_t ferry_dt_extent(const ferry_dt *t);

/* amode: ferry's bits, equal to Open MPI's MPI_MODE_* values. */
int ferry_cio_open(const char *addr, const char *path, uint64_t job, uint32_t rank,
                   uint32_t size, uint32_t amode, const char *token, ferry_cio_file **out,
                   uint64_t *size_at_open);
int ferry_cio_set_view(ferry_cio_file *f, int64_t disp, const ferry_dt *etype,
                       const ferry_dt *filetype);
int ferry_cio_write(ferry_cio_file *f, int collective, uint64_t offset, const void *buf,
                    uint64_t count, const ferry_dt *memtype, uint64_t *done);
int ferry_cio_read(ferry_cio_file *f, int collective, uint64_t offset, void *buf,
                   uint64_t count, const ferry_dt *memtype, uint64_t *done);
int ferry_cio_get_size(ferry_cio_file *f, uint64_t *size);
int ferry_cio_set_size(ferry_cio_file *f, uint64_t size);
int ferry_cio_preallocate(ferry_cio_file *f, uint64_t size);
int ferry_cio_sync(ferry_cio_file *f);
/* spec: off, on, CALLS or CALLS,BYTES (as FERRY_CIO_PIPELINE). */
int ferry_cio_set_pipeline(ferry_cio_file *f, const char *spec);
/* spec: off, on or a size in bytes with an optional K, M or G suffix
 * (as FERRY_CIO_READ_CACHE). */
int ferry_cio_set_read_cache(ferry_cio_file *f, const char *spec);
int ferry_cio_byte_offset(ferry_cio_file *f, uint64_t offset, uint64_t *out);
int ferry_cio_close(ferry_cio_file *f);
void ferry_cio_abandon(ferry_cio_file *f);

#ifdef __cplusplus
}
#endif
#endif
