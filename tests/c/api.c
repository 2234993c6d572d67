/*
 * Every function of ferry/exs.h, between two processes: init, socket/bind/listen/accept/
 * connect, send/recv as normal (rendezvous) and immediate transfers, a truncated recv
 * (EMSGSIZE), sendfile of a temporary file, a persistent recv written at offsets by the
 * peer (at the edge, and past it: EMSGSIZE), a persistent NOTIFY_ON_READ send read at
 * offsets (at the edge, short near it, past it: EINVAL), poll on sockets and listeners,
 * poll(2) on a queue's fd, fcntl before and after connect, socket names, invalid handles
 * (EBADF everywhere), double close, and deregistering memory in use (EBUSY).
 *
 *   api server LISTEN_URL ADDR_FILE     api client ADDR
 *
 * The conversation (C = client, S = server; messages C→S match S's recvs in order):
 *   C→S  M1 100000 B (seed 1), M2 100 B immediate (seed 2), M3 20 B into a 10 B recv,
 *        sendfile 150000 B at 3 and 50 B at 7 of a file (seed 4)
 *   S    posts a persistent 4096 B recv, then sends GO 5000 B (seed 5), then exposes a
 *        persistent NOTIFY_ON_READ 8192 B block (seed 7)
 *   C    writes three ranges of S's persistent recv with send_offset (+ one past its end),
 *        then reads S's block at offsets (+ one past its end), then closes
 *   S    counts the read notifications, checks its persistent recv block, sees the close
 */
#define _POSIX_C_SOURCE 200809L
#include <poll.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <time.h>

#include "common.h"

#define BIG (1 << 20)
#define PRECV 4096
#define PSEND 8192

/* Where the client writes into the server's persistent recv block. */
static const struct {
    size_t off, len;
    uint64_t seed;
} writes[] = {{0, 100, 60}, {1000, 700, 61}, {PRECV - 600, 600, 62}};
#define NWRITES (sizeof writes / sizeof writes[0])

/* Calls on invalid handles fail with EBADF; argument checks that need no connection. */
/* A thread blocked in exs_qdequeue(q, ..., -1) when q is deleted: -1/EBADF. */
static void *dequeue_forever(void *arg)
{
    exs_event_t ev;
    errno = 0;
    int n = exs_qdequeue(*(exs_qhandle_t *)arg, &ev, 1, -1);
    return (void *)(intptr_t)(n == -1 && errno == EBADF);
}

static void delete_under_a_waiter(void)
{
    exs_qhandle_t q = exs_qcreate(4);
    OK(q);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, dequeue_forever, &q) == 0, "pthread_create");
    struct timespec pause = {0, 50 * 1000 * 1000};
    nanosleep(&pause, NULL);
    OK(exs_qdelete(q));
    void *ok = NULL;
    CHECK(pthread_join(t, &ok) == 0 && ok, "the blocked exs_qdequeue did not fail with EBADF");
}

/* exs_bind: a host longer than 255 bytes is EINVAL; an unresolvable one binds (nothing is
 * resolved there) and exs_listen fails with EADDRNOTAVAIL. */
static void long_and_unresolvable_names(void)
{
    static char url[300000];
    int s = exs_socket(AF_UNSPEC, EXS_SOCK_SEQPACKET, 0);
    OK(s);
    strcpy(url, "tcp://");
    memset(url + 6, 'a', 256);
    strcpy(url + 6 + 256, ":1");
    FAILS(exs_bind(s, url), EINVAL);
    memset(url + 6, 'a', 200000);
    strcpy(url + 6 + 200000, ":1");
    FAILS(exs_bind(s, url), EINVAL);
    OK(exs_bind(s, "tcp://no-such-host.invalid:1"));
    FAILS(exs_listen(s, 4), EADDRNOTAVAIL);
    OK(exs_close(s));
}

static void misuse(exs_qhandle_t q)
{
    delete_under_a_waiter();
    long_and_unresolvable_names();
    char name[64];
    unsigned char mem[64];
    exs_event_t ev;
    const int bad[] = {-1, 0, 77777};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int h = bad[i];
        FAILS(exs_bind(h, "tcp://127.0.0.1:0"), EBADF);
        FAILS(exs_listen(h, 1), EBADF);
        FAILS(exs_accept(h, q, NULL), EBADF);
        FAILS(exs_connect(h, "tcp://127.0.0.1:1", q, NULL), EBADF);
        FAILS(exs_send(h, mem, 1, 0, h, q, NULL), EBADF);
        FAILS(exs_recv(h, mem, 1, 0, h, q, NULL), EBADF);
        FAILS(exs_send_offset(h, mem, 1, 0, 0, h, q, NULL), EBADF);
        FAILS(exs_recv_offset(h, mem, 1, 0, 0, h, q, NULL), EBADF);
        FAILS(exs_sendfile(h, 0, 0, 1, 0, q, NULL), EBADF);
        FAILS(exs_fcntl(h, EXS_F_GET_SEND_CREDITS, 0), EBADF);
        FAILS(exs_close(h), EBADF);
        FAILS(exs_getsockname(h, name, sizeof name), EBADF);
        FAILS(exs_getpeername(h, name, sizeof name), EBADF);
        FAILS(exs_qdequeue(h, &ev, 1, 0), EBADF);
        FAILS(exs_qdelete(h), EBADF);
        FAILS(exs_qfd(h), EBADF);
        FAILS(exs_mderegister(h), EBADF);
    }
    struct exs_pollfd p = {77777, EXS_POLLIN, 0};
    CHECK(exs_poll(&p, 1, 0) == 1 && p.revents == EXS_POLLNVAL, "revents %d", p.revents);
    /* More entries than the process may have descriptors: EINVAL, as poll(2), nothing read. */
    struct rlimit nofile;
    CHECK(getrlimit(RLIMIT_NOFILE, &nofile) == 0, "getrlimit");
    FAILS(exs_poll(&p, (nfds_t)-1, 0), EINVAL);
    if (nofile.rlim_cur != RLIM_INFINITY)
        FAILS(exs_poll(&p, (nfds_t)nofile.rlim_cur + 1, 0), EINVAL);
    FAILS(exs_poll(NULL, 1, 0), EFAULT);

    /* Wrong kinds of handle, socket arguments, registration arguments. */
    FAILS(exs_close(q), EBADF);
    FAILS(exs_socket(AF_UNSPEC, SOCK_STREAM, 0), EINVAL);
    FAILS(exs_socket(AF_UNSPEC, EXS_SOCK_SEQPACKET, 17), EPROTONOSUPPORT);
    FAILS(exs_socket(AF_UNIX, EXS_SOCK_SEQPACKET, 0), EAFNOSUPPORT);
    FAILS(exs_mregister(NULL, 64, 0), EINVAL);
    FAILS(exs_mregister(mem, 0, 0), EINVAL);
    FAILS(exs_mregister(mem, sizeof mem, 8), EINVAL);
    FAILS(exs_qcreate(-1), EINVAL);
    FAILS(exs_qdequeue(q, &ev, 0, 0), EINVAL);
    CHECK(exs_qdequeue(q, &ev, 1, 0) == 0, "%s", "an event on an idle queue");
    CHECK(exs_qdequeue(q, &ev, 1, 30) == 0, "%s", "an event on an idle queue");

    /* A queue deleted twice; a socket closed twice; a registration dropped twice. */
    exs_qhandle_t q2 = exs_qcreate(1);
    OK(q2);
    FAILS(exs_close(q2), EBADF);
    OK(exs_qdelete(q2));
    FAILS(exs_qdelete(q2), EBADF);
    int s = exs_socket(AF_UNSPEC, EXS_SOCK_SEQPACKET, 0);
    OK(s);
    FAILS(exs_qdelete(s), EBADF);
    FAILS(exs_listen(s, 1), EDESTADDRREQ);
    FAILS(exs_bind(s, "nonsense://x"), EINVAL);
    FAILS(exs_getsockname(s, name, sizeof name), ENOTCONN);
    FAILS(exs_send(s, mem, 1, 0, 77777, q, NULL), EBADF);
    exs_mhandle_t mh = exs_mregister(mem, sizeof mem, 0);
    OK(mh);
    FAILS(exs_send(s, mem, 1, 0, mh, q, NULL), ENOTCONN);
    OK(exs_close(s));
    FAILS(exs_close(s), EBADF);
    FAILS(exs_fcntl(s, EXS_F_GET_SEND_CREDITS, 0), EBADF);
    OK(exs_mderegister(mh));
    FAILS(exs_mderegister(mh), EBADF);
}

/* Names of a connected socket: URLs of the address's driver; ERANGE when too small. */
static void names(int s, const char *scheme)
{
    char mine[512], peer[512], tiny[4];
    OK(exs_getsockname(s, mine, sizeof mine));
    OK(exs_getpeername(s, peer, sizeof peer));
    CHECK(strncmp(mine, scheme, strlen(scheme)) == 0, "getsockname %s", mine);
    CHECK(strncmp(peer, scheme, strlen(scheme)) == 0, "getpeername %s", peer);
    FAILS(exs_getsockname(s, tiny, sizeof tiny), ERANGE);
    FAILS(exs_getpeername(s, tiny, sizeof tiny), ERANGE);
    printf("[%s] %s <-> %s\n", g_role, mine, peer);
}

/* Waits up to WAIT_MS for exs_poll to report `want` on s. */
static short poll_for(int s, short want)
{
    struct exs_pollfd p = {s, want, 0};
    int n = exs_poll(&p, 1, WAIT_MS);
    CHECK(n == 1 && (p.revents & want), "poll: %d, revents %#x", n, (unsigned)p.revents);
    return p.revents;
}

static void server(const char *url, const char *addr_file, const char *scheme)
{
    exs_qhandle_t q = exs_qcreate(32);
    OK(q);
    misuse(q);

    int l = exs_socket(AF_UNSPEC, EXS_SOCK_SEQPACKET, 0);
    OK(l);
    OK(exs_fcntl(l, EXS_F_SET_SMALL_PACKET_MAX, 256));
    OK(exs_bind(l, url));
    FAILS(exs_bind(l, url), EINVAL);
    OK(exs_listen(l, 4));
    FAILS(exs_fcntl(l, EXS_F_SET_SMALL_PACKET_MAX, 128), EINVAL);
    FAILS(exs_connect(l, url, q, NULL), EINVAL);
    char addr[512];
    OK(exs_getsockname(l, addr, sizeof addr));
    write_addr(addr_file, addr);

    /* The client's connection waits in the backlog: the listener polls readable. */
    poll_for(l, EXS_POLLIN);
    int a = accept_one(l, q);
    CHECK(exs_fcntl(a, EXS_F_GET_SMALL_PACKET_MAX, 0) == 256, "%s", "accepted socket settings");
    FAILS(exs_fcntl(a, EXS_F_SET_SMALL_PACKET_MAX, 128), EISCONN);
    names(a, scheme);

    unsigned char *big = alloc_mem(BIG), *pblk = alloc_mem(PRECV), *nblk = alloc_mem(PSEND);
    exs_mhandle_t mh = exs_mregister(big, BIG, 0), pmh = exs_mregister(pblk, PRECV, 0),
                  nmh = exs_mregister(nblk, PSEND, 0);
    OK(mh);
    OK(pmh);
    OK(nmh);

    /* M1 announces itself: the socket polls readable (and writable: credits are free). */
    poll_for(a, EXS_POLLIN);
    struct exs_pollfd pw = {a, EXS_POLLOUT, 0};
    CHECK(exs_poll(&pw, 1, WAIT_MS) == 1 && pw.revents == EXS_POLLOUT, "revents %#x",
          (unsigned)pw.revents);
    FAILS(exs_recv(a, big + BIG - 10, 11, 0, mh, q, NULL), EFAULT);
    FAILS(exs_recv(a, big, 10, 8, mh, q, NULL), EINVAL);
    OK(exs_recv(a, big, 100000, 0, mh, q, ctx_of(1)));
    /* The queue's fd becomes readable with the completion; then a zero-timeout dequeue. */
    struct pollfd pf = {exs_qfd(q), POLLIN, 0};
    OK(pf.fd);
    CHECK(poll(&pf, 1, WAIT_MS) == 1 && (pf.revents & POLLIN), "%s", "queue fd not readable");
    exs_event_t ev;
    CHECK(exs_qdequeue(q, &ev, 1, 0) == 1, "%s", "no event behind a readable queue fd");
    CHECK(ev.type == EXS_EVT_RECV && ev.err == 0 && ev.context == ctx_of(1) && ev.buf == big &&
              ev.len == 100000 && ev.sock == a,
          "M1 event type %d err %d len %zu", ev.type, ev.err, ev.len);
    CHECK(verify(big, 100000, 1) == 100000, "%s", "M1 bytes differ");

    /* M2: immediate. */
    OK(exs_recv(a, big + 5, 4096, 0, mh, q, ctx_of(2)));
    ev = wait_ok(q, EXS_EVT_RECV, ctx_of(2));
    CHECK(ev.len == 100 && ev.buf == big + 5 && verify(big + 5, 100, 2) == 100, "M2 len %zu",
          ev.len);

    /* M3: 20 bytes into 10 — truncated, the prefix kept. */
    OK(exs_recv(a, big, 10, 0, mh, q, ctx_of(3)));
    ev = wait_event(q, EXS_EVT_RECV, ctx_of(3));
    CHECK(ev.err == EMSGSIZE && ev.len == 10 && verify(big, 10, 3) == 10, "M3 err %d len %zu",
          ev.err, ev.len);

    /* The two sendfiles: file bytes [3, 150003) and [7, 57). */
    OK(exs_recv(a, big, 150000, 0, mh, q, ctx_of(4)));
    ev = wait_ok(q, EXS_EVT_RECV, ctx_of(4));
    CHECK(ev.len == 150000, "sendfile 1: %zu bytes", ev.len);
    for (size_t i = 0; i < 150000; i++)
        CHECK(big[i] == pattern_byte(4, 3 + i), "sendfile 1 differs at %zu", i);
    OK(exs_recv(a, big, 64, 0, mh, q, ctx_of(5)));
    ev = wait_ok(q, EXS_EVT_RECV, ctx_of(5));
    CHECK(ev.len == 50, "sendfile 2: %zu bytes", ev.len);
    for (size_t i = 0; i < 50; i++)
        CHECK(big[i] == pattern_byte(4, 7 + i), "sendfile 2 differs at %zu", i);

    /* A persistent recv block for the client's send_offset writes, then GO. */
    OK(exs_recv(a, pblk, PRECV, EXS_PERSISTENT, pmh, q, ctx_of(6)));
    fill(big, 5000, 5);
    OK(exs_send(a, big, 5000, 0, mh, q, ctx_of(7)));
    wait_ok(q, EXS_EVT_SEND, ctx_of(7));

    /* A persistent block the client reads at offsets; each read is notified. */
    fill(nblk, PSEND, 7);
    OK(exs_send(a, nblk, PSEND, EXS_PERSISTENT | EXS_NOTIFY_ON_READ, nmh, q, ctx_of(8)));
    FAILS(exs_mderegister(nmh), EBUSY);
    const size_t reads[] = {192, 192, 191};
    for (size_t i = 0; i < 3; i++) {
        ev = wait_ok(q, EXS_EVT_READ_NOTIFY, ctx_of(8));
        CHECK(ev.len == reads[i] && ev.buf == nblk && ev.sock == a, "notify %zu: len %zu", i,
              ev.len);
    }

    /* By then the client's writes have landed in the persistent recv block. */
    for (size_t i = 0; i < PRECV; i++) {
        unsigned char want = 0;
        for (size_t w = 0; w < NWRITES; w++)
            if (i >= writes[w].off && i < writes[w].off + writes[w].len)
                want = pattern_byte(writes[w].seed, i - writes[w].off);
        CHECK(pblk[i] == want, "persistent recv block differs at %zu", i);
    }
    FAILS(exs_mderegister(pmh), EBUSY);

    /* The client closes: its close, then the persistent operations end with an error. */
    ev = wait_event(q, EXS_EVT_CLOSE, NULL);
    CHECK(ev.sock == a, "close event for %d", ev.sock);
    printf("[%s] peer close reported with err %d\n", g_role, ev.err);
    ev = wait_event(q, EXS_EVT_SEND, ctx_of(8));
    CHECK(ev.err != 0 && ev.buf == nblk, "persistent send ended with err %d", ev.err);
    ev = wait_event(q, EXS_EVT_RECV, ctx_of(6));
    CHECK(ev.err != 0 && ev.buf == pblk, "persistent recv ended with err %d", ev.err);
    CHECK(poll_for(a, EXS_POLLHUP) & EXS_POLLHUP, "%s", "no POLLHUP");
    /* Data calls on the ended connection start, and complete at once with ENOTCONN. */
    OK(exs_send(a, big, 10, 0, mh, q, ctx_of(10)));
    ev = wait_event(q, EXS_EVT_SEND, ctx_of(10));
    CHECK(ev.err == ENOTCONN, "send after the end: err %d", ev.err);
    OK(exs_recv(a, big, 10, 0, mh, q, ctx_of(11)));
    ev = wait_event(q, EXS_EVT_RECV, ctx_of(11));
    CHECK(ev.err == ENOTCONN, "recv after the end: err %d", ev.err);
    OK(exs_close(a));
    FAILS(exs_close(a), EBADF);
    FAILS(exs_recv(a, big, 1, 0, mh, q, NULL), EBADF);

    /* A pending accept ends when its listener closes. */
    OK(exs_accept(l, q, ctx_of(9)));
    OK(exs_close(l));
    ev = wait_event(q, EXS_EVT_ACCEPT, ctx_of(9));
    CHECK(ev.err == ECANCELED && ev.sock == l && ev.accepted == -1, "accept err %d", ev.err);
    FAILS(exs_accept(l, q, NULL), EBADF);

    OK(exs_mderegister(mh));
    OK(exs_mderegister(pmh));
    OK(exs_mderegister(nmh));
    OK(exs_qdelete(q));
    free(big);
    free(pblk);
    free(nblk);
}

static void client(const char *addr, const char *scheme)
{
    exs_qhandle_t q = exs_qcreate(32);
    OK(q);
    misuse(q);

    int s = exs_socket(AF_UNSPEC, EXS_SOCK_SEQPACKET, 0);
    OK(s);
    /* Settings before connect. */
    OK(exs_fcntl(s, EXS_F_SET_SEND_CREDITS, 8));
    CHECK(exs_fcntl(s, EXS_F_GET_SEND_CREDITS, 0) == 8, "%s", "send credits");
    OK(exs_fcntl(s, EXS_F_SET_RECV_CREDITS, 12));
    CHECK(exs_fcntl(s, EXS_F_GET_RECV_CREDITS, 0) == 12, "%s", "recv credits");
    OK(exs_fcntl(s, EXS_F_SET_SMALL_PACKET_MAX, 256));
    CHECK(exs_fcntl(s, EXS_F_GET_SMALL_PACKET_MAX, 0) == 256, "%s", "small packet max");
    OK(exs_fcntl(s, EXS_F_SET_PUSH, 1));
    CHECK(exs_fcntl(s, EXS_F_GET_PUSH, 0) == 1, "%s", "push");
    OK(exs_fcntl(s, EXS_F_SET_CONNECT_TIMEOUT, 15000));
    CHECK(exs_fcntl(s, EXS_F_GET_CONNECT_TIMEOUT, 0) == 15000, "%s", "connect timeout");
    FAILS(exs_fcntl(s, EXS_F_SET_SEND_CREDITS, 0), EINVAL);
    FAILS(exs_fcntl(s, EXS_F_SET_SMALL_PACKET_MAX, 65537), EINVAL);
    FAILS(exs_fcntl(s, 12345, 0), EINVAL);
    char name[64];
    FAILS(exs_getpeername(s, name, sizeof name), ENOTCONN);
    struct exs_pollfd pf = {s, EXS_POLLIN | EXS_POLLOUT, 0};
    CHECK(exs_poll(&pf, 1, 0) == 0, "fresh socket revents %#x", (unsigned)pf.revents);

    connect_to(s, addr, q);
    /* ... and after. */
    FAILS(exs_fcntl(s, EXS_F_SET_SEND_CREDITS, 4), EISCONN);
    FAILS(exs_fcntl(s, EXS_F_SET_PUSH, 0), EISCONN);
    CHECK(exs_fcntl(s, EXS_F_GET_SEND_CREDITS, 0) == 8, "%s", "send credits after connect");
    FAILS(exs_connect(s, addr, q, NULL), EISCONN);
    names(s, scheme);

    unsigned char *big = alloc_mem(BIG);
    exs_mhandle_t mh = exs_mregister(big, BIG, 0);
    OK(mh);
    FAILS(exs_send(s, big + 1, BIG, 0, mh, q, NULL), EFAULT);
    FAILS(exs_send(s, (void *)((uintptr_t)big - 1), 2, 0, mh, q, NULL), EFAULT);
    FAILS(exs_send(s, big, 10, 4, mh, q, NULL), EINVAL);

    /* M1 (a rendezvous); the memory is busy until its event is dequeued. */
    fill(big, 100000, 1);
    OK(exs_send(s, big, 100000, 0, mh, q, ctx_of(11)));
    FAILS(exs_mderegister(mh), EBUSY);
    exs_event_t ev = wait_ok(q, EXS_EVT_SEND, ctx_of(11));
    CHECK(ev.buf == big && ev.len == 100000 && ev.sock == s, "M1 send event len %zu", ev.len);

    /* M2 immediate, M3 to be truncated. */
    fill(big + 200000, 100, 2);
    OK(exs_send(s, big + 200000, 100, 0, mh, q, ctx_of(12)));
    fill(big + 300000, 20, 3);
    OK(exs_send(s, big + 300000, 20, 0, mh, q, ctx_of(13)));

    /* Sendfile from a temporary file, closed and removed at once. */
    char path[] = "/tmp/ferry-capi-api-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp %s", path);
    unsigned char *file = malloc(200000);
    CHECK(file != NULL, "%s", "malloc");
    fill(file, 200000, 4);
    CHECK(write(fd, file, 200000) == 200000, "%s", "write temp file");
    free(file);
    FAILS(exs_sendfile(s, fd, 0, 300000, 0, q, NULL), EINVAL);
    FAILS(exs_sendfile(s, fd, -1, 10, 0, q, NULL), EINVAL);
    FAILS(exs_sendfile(s, -1, 0, 10, 0, q, NULL), EBADF);
    OK(exs_sendfile(s, fd, 3, 150000, 0, q, ctx_of(14)));
    OK(exs_sendfile(s, fd, 7, 50, 0, q, ctx_of(15)));
    close(fd);
    unlink(path);
    ev = wait_ok(q, EXS_EVT_SEND, ctx_of(12));
    CHECK(ev.len == 100, "M2 len %zu", ev.len);
    /* The sender of a truncated message succeeds and learns how much the receiver took. */
    ev = wait_ok(q, EXS_EVT_SEND, ctx_of(13));
    CHECK(ev.len == 10, "M3 len %zu", ev.len);
    ev = wait_ok(q, EXS_EVT_SEND, ctx_of(14));
    CHECK(ev.buf == NULL && ev.len == 150000, "sendfile event len %zu", ev.len);
    wait_ok(q, EXS_EVT_SEND, ctx_of(15));

    /* NOTIFY_ON_READ without PERSISTENT: the send fails in its event, nothing is sent. */
    OK(exs_send(s, big, 10, EXS_NOTIFY_ON_READ, mh, q, ctx_of(16)));
    ev = wait_event(q, EXS_EVT_SEND, ctx_of(16));
    CHECK(ev.err == EINVAL, "bad flags: err %d", ev.err);

    /* GO: wait until it is readable, then receive it. */
    poll_for(s, EXS_POLLIN);
    OK(exs_recv(s, big, 8192, 0, mh, q, ctx_of(21)));
    ev = wait_ok(q, EXS_EVT_RECV, ctx_of(21));
    CHECK(ev.len == 5000 && verify(big, 5000, 5) == 5000, "GO len %zu", ev.len);

    /* Write three ranges of the server's persistent recv block, then one past its end. */
    for (size_t w = 0; w < NWRITES; w++) {
        unsigned char *src = big + 10000 * (w + 1);
        fill(src, writes[w].len, writes[w].seed);
        OK(exs_send_offset(s, src, writes[w].len, writes[w].off, 0, mh, q, ctx_of(31 + w)));
    }
    OK(exs_send_offset(s, big, 100, PRECV - 96, 0, mh, q, ctx_of(34)));
    for (size_t w = 0; w < NWRITES; w++) {
        ev = wait_ok(q, EXS_EVT_SEND, ctx_of(31 + w));
        CHECK(ev.len == writes[w].len, "write %zu: len %zu", w, ev.len);
    }
    ev = wait_event(q, EXS_EVT_SEND, ctx_of(34));
    CHECK(ev.err == EMSGSIZE, "write past the block: err %d", ev.err);

    /* Read the server's persistent block at offsets: inside, at the edge, short, at the very
     * end (offset == size: an empty read, err 0), past (EINVAL). */
    unsigned char *r = big + 500000;
    OK(exs_recv_offset(s, r, 192, 0, 0, mh, q, ctx_of(41)));
    ev = wait_ok(q, EXS_EVT_RECV, ctx_of(41));
    CHECK(ev.len == 192 && verify(r, 192, 7) == 192, "read at 0: len %zu", ev.len);
    OK(exs_recv_offset(s, r, 192, PSEND - 192, 0, mh, q, ctx_of(42)));
    ev = wait_ok(q, EXS_EVT_RECV, ctx_of(42));
    CHECK(ev.len == 192, "read at the edge: len %zu", ev.len);
    for (size_t i = 0; i < 192; i++)
        CHECK(r[i] == pattern_byte(7, PSEND - 192 + i), "edge read differs at %zu", i);
    OK(exs_recv_offset(s, r, 192, PSEND - 191, 0, mh, q, ctx_of(43)));
    ev = wait_ok(q, EXS_EVT_RECV, ctx_of(43));
    CHECK(ev.len == 191, "short read: len %zu", ev.len);
    OK(exs_recv_offset(s, r, 192, PSEND, 0, mh, q, ctx_of(45)));
    ev = wait_event(q, EXS_EVT_RECV, ctx_of(45));
    CHECK(ev.err == 0 && ev.len == 0, "read at the very end: err %d len %zu", ev.err, ev.len);
    OK(exs_recv_offset(s, r, 192, PSEND + 1, 0, mh, q, ctx_of(44)));
    ev = wait_event(q, EXS_EVT_RECV, ctx_of(44));
    CHECK(ev.err == EINVAL, "read past the block: err %d", ev.err);

    /* Close: our close event, then the handle is gone. */
    OK(exs_close(s));
    ev = wait_event(q, EXS_EVT_CLOSE, NULL);
    CHECK(ev.sock == s && ev.err == 0, "close event for %d err %d", ev.sock, ev.err);
    FAILS(exs_close(s), EBADF);
    FAILS(exs_send(s, big, 1, 0, mh, q, NULL), EBADF);
    OK(exs_mderegister(mh));
    OK(exs_qdelete(q));
    free(big);
}

int main(int argc, char **argv)
{
    if (argc < 3)
        usage(argv[0]);
    int is_server = strcmp(argv[1], "server") == 0;
    g_role = is_server ? "api server" : "api client";
    FAILS(exs_init(EXS_MAKE_VERSION(EXS_VERSION_MAJOR + 1, 0)), ENOTSUP);
    OK(exs_init(EXS_VERSION));

    /* The URL's scheme, e.g. "ofi+tcp://": names must use it too. */
    const char *url = argv[2];
    const char *sep = strstr(url, "://");
    CHECK(sep != NULL, "not a URL: %s", url);
    char scheme[32];
    snprintf(scheme, sizeof scheme, "%.*s://", (int)(sep - url), url);

    if (is_server) {
        if (argc != 4)
            usage(argv[0]);
        server(url, argv[3], scheme);
    } else {
        client(url, scheme);
    }
    printf("%s: every call behaved\n", g_role);
    return 0;
}
