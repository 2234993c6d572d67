/*
 * Ping-pong latency, blocking against polling: ROUNDS round trips of a 10-byte message
 * with exs_qdequeue(q, ev, 1, -1) (blocking), then the same with exs_qdequeue(q, ev, 1, 0)
 * in a loop (polling). The client prints the median one-way latency of each, in
 * microseconds (half the round trip). Every byte is checked. Polling must not be the slow
 * way: its median may be at most 3 x blocking's + 200 us (loose, for a shared CI host; a
 * zero-timeout dequeue used to wait for a progress thread's tick: 5-8 ms against 40-60 us).
 *
 *   latency server LISTEN_URL ADDR_FILE     latency client ADDR
 */
#define _POSIX_C_SOURCE 200809L
#include <time.h>

#include "common.h"

#define ROUNDS 500
#define LEN 10

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The next event; polling spins on a zero timeout. */
static exs_event_t next(exs_qhandle_t q, int polling)
{
    exs_event_t ev;
    double give_up = now_us() + WAIT_MS * 1000.0;
    for (;;) {
        int n = exs_qdequeue(q, &ev, 1, polling ? 0 : WAIT_MS);
        if (n == 1) {
            errno = ev.err;
            CHECK(ev.err == 0, "%s event failed", evt_name(ev.type));
            return ev;
        }
        CHECK(n == 0 && now_us() < give_up, "no event within %d ms", WAIT_MS);
    }
}

/* Waits for the recv (ctx 1) and the send (ctx 2) of one round, in whatever order. */
static void round_done(exs_qhandle_t q, int polling, const unsigned char *rbuf, uint64_t seed)
{
    int got = 0;
    while (got != 3) {
        exs_event_t ev = next(q, polling);
        got |= ev.context == ctx_of(1) ? 1 : 2;
    }
    CHECK(verify(rbuf, LEN, seed) == LEN, "bytes differ");
}

int main(int argc, char **argv)
{
    if (argc < 3)
        usage(argv[0]);
    int server = strcmp(argv[1], "server") == 0;
    g_role = server ? "latency server" : "latency client";
    OK(exs_init(EXS_VERSION));
    exs_qhandle_t q = exs_qcreate(64);
    OK(q);
    unsigned char *sbuf = alloc_mem(4096), *rbuf = alloc_mem(4096);
    exs_mhandle_t smh = exs_mregister(sbuf, 4096, 0), rmh = exs_mregister(rbuf, 4096, 0);
    OK(smh);
    OK(rmh);
    int s, l = -1;
    if (server) {
        if (argc != 4)
            usage(argv[0]);
        l = listen_on(argv[2], argv[3]);
        s = accept_one(l, q);
    } else {
        s = exs_socket(AF_UNSPEC, EXS_SOCK_SEQPACKET, 0);
        OK(s);
        connect_to(s, argv[2], q);
    }
    static double t[ROUNDS];
    double median[2];
    for (int polling = 0; polling < 2; polling++) {
        for (uint64_t r = 0; r < ROUNDS; r++) {
            uint64_t seed = 2 * r + (uint64_t)server;
            fill(sbuf, LEN, seed);
            double t0 = now_us();
            OK(exs_recv(s, rbuf, LEN, 0, rmh, q, ctx_of(1)));
            if (server) {
                /* Answer once the ping is in. */
                exs_event_t ev = next(q, polling);
                CHECK(ev.context == ctx_of(1), "expected the recv");
                CHECK(verify(rbuf, LEN, seed - 1) == LEN, "bytes differ");
                OK(exs_send(s, sbuf, LEN, 0, smh, q, ctx_of(2)));
                next(q, polling);
            } else {
                OK(exs_send(s, sbuf, LEN, 0, smh, q, ctx_of(2)));
                round_done(q, polling, rbuf, seed + 1);
            }
            t[r] = (now_us() - t0) / 2;
        }
        qsort(t, ROUNDS, sizeof t[0], cmp);
        median[polling] = t[ROUNDS / 2];
    }
    CHECK(median[1] <= 3 * median[0] + 200, "polling %.1f us against blocking %.1f us",
          median[1], median[0]);
    if (!server)
        printf("%s: one-way latency, %d B, median of %d: blocking %.1f us, polling %.1f us\n",
               g_role, LEN, ROUNDS, median[0], median[1]);
    if (server) {
        wait_event(q, EXS_EVT_CLOSE, NULL);
        OK(exs_close(s));
        OK(exs_close(l));
    } else {
        OK(exs_close(s));
    }
    return 0;
}
