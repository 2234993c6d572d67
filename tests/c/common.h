/*
 * Helpers shared by the C tests: checks that exit with a message, deterministic byte
 * patterns, waiting for one particular event while keeping the others, and the address
 * file a server hands its client.
 *
 * Every wait gives up after WAIT_MS, so a broken test fails instead of hanging.
 */
#ifndef FERRY_TEST_COMMON_H
#define FERRY_TEST_COMMON_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <ferry/exs.h>

#define WAIT_MS 20000

static const char *g_role = "?";

#define CHECK(cond, ...)                                                                   \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            fprintf(stderr, "[%s] %s:%d: check failed: %s: ", g_role, __FILE__, __LINE__,  \
                    #cond);                                                                \
            fprintf(stderr, __VA_ARGS__);                                                  \
            fprintf(stderr, " (errno %d: %s)\n", errno, strerror(errno));                  \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

/* A call that must succeed (return >= 0). */
#define OK(call) CHECK((call) >= 0, "%s", "call failed")

/* A call that must fail with -1 and errno e. */
#define FAILS(call, e)                                                                     \
    do {                                                                                   \
        errno = 0;                                                                         \
        long r_ = (long)(call);                                                            \
        CHECK(r_ == -1 && errno == (e), "expected -1/%s, got %ld", #e, r_);                \
    } while (0)

static inline unsigned char pattern_byte(uint64_t seed, size_t i)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + i * 31u;
    return (unsigned char)(x ^ (x >> 17) ^ (x >> 29));
}

static inline void fill(void *buf, size_t len, uint64_t seed)
{
    unsigned char *b = buf;
    for (size_t i = 0; i < len; i++)
        b[i] = pattern_byte(seed, i);
}

/* Index of the first byte that differs from the pattern, or len. */
static inline size_t verify(const void *buf, size_t len, uint64_t seed)
{
    const unsigned char *b = buf;
    for (size_t i = 0; i < len; i++)
        if (b[i] != pattern_byte(seed, i))
            return i;
    return len;
}

static inline void *ctx_of(uintptr_t n) { return (void *)n; }

/* Events taken from a queue while waiting for another one. */
#define STASH_MAX 256
static exs_event_t g_stash[STASH_MAX];
static int g_nstash;

static inline const char *evt_name(int t)
{
    switch (t) {
    case EXS_EVT_SEND: return "SEND";
    case EXS_EVT_RECV: return "RECV";
    case EXS_EVT_ACCEPT: return "ACCEPT";
    case EXS_EVT_CONNECT: return "CONNECT";
    case EXS_EVT_READ_NOTIFY: return "READ_NOTIFY";
    case EXS_EVT_CLOSE: return "CLOSE";
    default: return "?";
    }
}

/* The next event of `type` with context `ctx` (ctx ignored for EXS_EVT_CLOSE) on q. */
static inline exs_event_t wait_event(exs_qhandle_t q, int type, void *ctx)
{
    for (int i = 0; i < g_nstash; i++) {
        exs_event_t ev = g_stash[i];
        if (ev.type == type && (type == EXS_EVT_CLOSE || ev.context == ctx)) {
            memmove(&g_stash[i], &g_stash[i + 1], (size_t)(g_nstash - i - 1) * sizeof ev);
            g_nstash--;
            return ev;
        }
    }
    for (;;) {
        exs_event_t ev;
        int n = exs_qdequeue(q, &ev, 1, WAIT_MS);
        CHECK(n == 1, "no %s event (ctx %p) within %d ms", evt_name(type), ctx, WAIT_MS);
        if (ev.type == type && (type == EXS_EVT_CLOSE || ev.context == ctx))
            return ev;
        CHECK(g_nstash < STASH_MAX, "too many unexpected events");
        g_stash[g_nstash++] = ev;
    }
}

/* Like wait_event, and the event must have succeeded. */
static inline exs_event_t wait_ok(exs_qhandle_t q, int type, void *ctx)
{
    exs_event_t ev = wait_event(q, type, ctx);
    errno = ev.err;
    CHECK(ev.err == 0, "%s event (ctx %p) failed", evt_name(type), ctx);
    return ev;
}

/* Publishes the server's address for its client (written, then renamed into place). */
static inline void write_addr(const char *path, const char *addr)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    CHECK(f != NULL, "open %s", tmp);
    fprintf(f, "%s\n", addr);
    CHECK(fclose(f) == 0, "write %s", tmp);
    CHECK(rename(tmp, path) == 0, "rename %s", tmp);
}

/* A listening socket on url (port 0 allowed) whose resolved address goes to addr_file. */
static inline int listen_on(const char *url, const char *addr_file)
{
    int l = exs_socket(AF_UNSPEC, EXS_SOCK_SEQPACKET, 0);
    OK(l);
    OK(exs_bind(l, url));
    OK(exs_listen(l, 4));
    char addr[512];
    OK(exs_getsockname(l, addr, sizeof addr));
    write_addr(addr_file, addr);
    return l;
}

/* Accepts one connection on l, announced on q. */
static inline int accept_one(int l, exs_qhandle_t q)
{
    OK(exs_accept(l, q, ctx_of(0xacc)));
    exs_event_t ev = wait_ok(q, EXS_EVT_ACCEPT, ctx_of(0xacc));
    CHECK(ev.sock == l && ev.accepted > 0, "accept event: sock %d accepted %d", ev.sock,
          ev.accepted);
    return ev.accepted;
}

/* Connects fresh socket s to addr, announced on q. */
static inline void connect_to(int s, const char *addr, exs_qhandle_t q)
{
    OK(exs_connect(s, addr, q, ctx_of(0xc0)));
    exs_event_t ev = wait_ok(q, EXS_EVT_CONNECT, ctx_of(0xc0));
    CHECK(ev.sock == s, "connect event for socket %d", ev.sock);
}

/* Page-aligned zeroed memory. */
static inline void *alloc_mem(size_t len)
{
    void *p = NULL;
    CHECK(posix_memalign(&p, 4096, len) == 0, "posix_memalign %zu", len);
    memset(p, 0, len);
    return p;
}

static inline void usage(const char *prog)
{
    fprintf(stderr, "usage: %s server LISTEN_URL ADDR_FILE | client ADDR\n", prog);
    exit(2);
}

#endif
