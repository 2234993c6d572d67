/*
 * Peer killed with transfers in flight: the client (the victim) connects, posts 4 sends
 * of 4 MiB, tells the server its pid and then waits; the server posts 4 sends and 4 recvs
 * of 4 MiB and kills the client with SIGKILL. Every one of the server's 8 operations must
 * then complete exactly once within the peer timeout it set (FERRY_OFI_PEER_TIMEOUT=1 s;
 * the native tcp driver hears of the death from the kernel): a send with ECONNRESET (the
 * client posted no recv), a recv either with the client's whole message or with
 * ECONNRESET; the connection's close event says ECONNRESET; and, the socket closed, the
 * memory deregisters.
 *
 *   peerkill server LISTEN_URL ADDR_FILE     peerkill client ADDR   (killed by the server)
 */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <time.h>

#include "common.h"

#define N 4
#define MSG (4u << 20)
/* The bound the server checks: its peer timeout (1 s) plus the keepalive's slack. */
#define BOUND_MS 4000

static long now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000L + t.tv_nsec / 1000000L;
}

static void victim(const char *addr)
{
    exs_qhandle_t q = exs_qcreate(16);
    OK(q);
    unsigned char *mem = alloc_mem((size_t)N * MSG);
    for (uintptr_t i = 0; i < N; i++)
        fill(mem + i * MSG, MSG, i);
    exs_mhandle_t mh = exs_mregister(mem, (size_t)N * MSG, 0);
    OK(mh);
    int64_t pid = getpid();
    exs_mhandle_t pmh = exs_mregister(&pid, sizeof pid, 0);
    OK(pmh);
    int s = exs_socket(AF_UNSPEC, EXS_SOCK_SEQPACKET, 0);
    OK(s);
    connect_to(s, addr, q);
    OK(exs_send(s, &pid, sizeof pid, 0, pmh, q, ctx_of(99)));
    for (uintptr_t i = 0; i < N; i++)
        OK(exs_send(s, mem + i * MSG, MSG, 0, mh, q, ctx_of(i)));
    sleep(60); /* until killed */
    fprintf(stderr, "[%s] was not killed\n", g_role);
    exit(1);
}

int main(int argc, char **argv)
{
    if (argc < 3)
        usage(argv[0]);
    int server = strcmp(argv[1], "server") == 0;
    g_role = server ? "peerkill server" : "peerkill client";
    if (server)
        setenv("FERRY_OFI_PEER_TIMEOUT", "1", 1);
    OK(exs_init(EXS_VERSION));
    if (!server)
        victim(argv[2]);
    if (argc != 4)
        usage(argv[0]);
    exs_qhandle_t q = exs_qcreate(64);
    OK(q);
    unsigned char *mem = alloc_mem((size_t)2 * N * MSG);
    exs_mhandle_t mh = exs_mregister(mem, (size_t)2 * N * MSG, 0);
    OK(mh);
    int64_t pid = 0;
    exs_mhandle_t pmh = exs_mregister(&pid, sizeof pid, 0);
    OK(pmh);
    int l = listen_on(argv[2], argv[3]);
    int s = accept_one(l, q);
    OK(exs_recv(s, &pid, sizeof pid, 0, pmh, q, ctx_of(99)));
    wait_ok(q, EXS_EVT_RECV, ctx_of(99));
    CHECK(pid > 1, "client pid %lld", (long long)pid);
    OK(exs_mderegister(pmh));
    /* Contexts 0..N-1: recvs; N..2N-1: sends. */
    for (uintptr_t i = 0; i < N; i++)
        OK(exs_recv(s, mem + i * MSG, MSG, 0, mh, q, ctx_of(i)));
    for (uintptr_t i = 0; i < N; i++)
        OK(exs_send(s, mem + (N + i) * MSG, MSG, 0, mh, q, ctx_of(N + i)));
    struct timespec pause = {0, 20 * 1000 * 1000};
    nanosleep(&pause, NULL);
    CHECK(kill((pid_t)pid, SIGKILL) == 0, "kill %lld", (long long)pid);
    long killed = now_ms();

    int seen[2 * N] = {0}, closes = 0, done = 0;
    while (done < 2 * N || closes == 0) {
        long left = killed + BOUND_MS - now_ms();
        exs_event_t ev;
        int n = exs_qdequeue(q, &ev, 1, left > 0 ? (int)left : 0);
        CHECK(n == 1, "%d of %d operations and %d close events within %d ms of the kill", done,
              2 * N, closes, BOUND_MS);
        fprintf(stderr, "[%s] %ld ms: %s ctx %p err %d len %zu\n", g_role, now_ms() - killed,
                evt_name(ev.type), ev.context, ev.err, ev.len);
        if (ev.type == EXS_EVT_CLOSE) {
            errno = ev.err;
            CHECK(ev.err == ECONNRESET, "close event err %d", ev.err);
            closes++;
            continue;
        }
        uintptr_t c = (uintptr_t)ev.context;
        CHECK(c < 2 * N, "event type %d for context %p", ev.type, ev.context);
        CHECK(seen[c]++ == 0, "a second event for operation %lu", (unsigned long)c);
        done++;
        errno = ev.err;
        if (c < N) {
            CHECK(ev.type == EXS_EVT_RECV, "recv %lu: event type %d", (unsigned long)c, ev.type);
            CHECK(ev.err == ECONNRESET || (ev.err == 0 && ev.len == MSG &&
                                           verify(ev.buf, MSG, c) == MSG),
                  "recv %lu: err %d len %zu", (unsigned long)c, ev.err, ev.len);
        } else {
            CHECK(ev.type == EXS_EVT_SEND, "send %lu: event type %d", (unsigned long)c, ev.type);
            CHECK(ev.err == ECONNRESET, "send %lu: err %d", (unsigned long)c, ev.err);
        }
    }
    long took = now_ms() - killed;
    /* Exactly once: nothing more comes. */
    exs_event_t extra;
    int n = exs_qdequeue(q, &extra, 1, 300);
    CHECK(n == 0, "an extra event: type %d ctx %p err %d", extra.type, extra.context, extra.err);
    OK(exs_close(s));
    OK(exs_close(l));
    int r = -1;
    for (int i = 0; i < 100 && r != 0; i++) {
        r = exs_mderegister(mh);
        if (r != 0)
            nanosleep(&pause, NULL);
    }
    CHECK(r == 0, "exs_mderegister after the close");
    printf("%s: 8 operations and the close completed %ld ms after the kill\n", g_role, took);
    return 0;
}
