/*
 * Ping-pong latency, blocking against polling: ROUNDS round trips of a 10-byte message
 * with exs_qdequeue(q, ev, 1, -1) (blocking), then the same with exs_qdequeue(q, ev, 1, 0)
 * in a loop (polling). The client prints the median one-way latency of each, in
 * microseconds (half the round trip). Every byte is checked. Polling must not be the slow
 * way: without the optional arguments its median may be at most 3 x blocking's + 200 us
 * (loose, for a shared CI host; a zero-timeout dequeue used to wait for a progress
 * thread's tick: 5-8 ms against 40-60 us).
 *
 *   latency server LISTEN_URL ADDR_FILE [ROUNDS WARM SMALL_MAX [POLL_FIRST]]
 *   latency client ADDR [ROUNDS WARM SMALL_MAX [POLL_FIRST]]
 *
 * The optional arguments (the same on both sides) are what `ferry bench exs` runs for its
 * C-API rows: ROUNDS recorded round trips after WARM unrecorded ones,
 * EXS_F_SET_SMALL_PACKET_MAX set to SMALL_MAX on the client (0: normal mode, every message
 * read by RMA as the bench's normal row does), and with POLL_FIRST 1 the polling phase
 * before the blocking one (the bench alternates the order); without them 500 rounds, no
 * warm-up, the default small packet size (10 bytes then travel as immediate data),
 * blocking first. `ferry bench exs-pingpong` is this program's twin in Rust, with the same
 * arguments (all of them) and output.
 */
#define _POSIX_C_SOURCE 200809L
#include <time.h>

#include "common.h"

#define ROUNDS 500
#define LEN 10

/* The optional arguments after the role's own: ROUNDS WARM SMALL_MAX [POLL_FIRST]
 * (SMALL_MAX -1: the default). */
struct opts {
    long rounds, warm, small, poll_first;
};

static long number(const char *s, long lo, long hi)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    CHECK(*s && !*end && errno == 0 && v >= lo && v <= hi, "bad number %s", s);
    return v;
}

static struct opts parse_opts(int argc, char **argv, int first)
{
    struct opts o = {ROUNDS, 0, -1, 0};
    if (argc == first)
        return o;
    if (argc != first + 3 && argc != first + 4)
        usage(argv[0]);
    o.rounds = number(argv[first], 1, 10000000);
    o.warm = number(argv[first + 1], 0, 10000000);
    o.small = number(argv[first + 2], 0, 65536);
    if (argc == first + 4)
        o.poll_first = number(argv[first + 3], 0, 1);
    return o;
}

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

/* Waits for the recv (ctx 1) and the send (ctx 2) of one round, in whatever order; the
 * time the recv's event came (the round trip ends there, as `ferry bench exs`'s Rust row
 * times it: the send's event and the check of the bytes are not part of it). */
static double round_done(exs_qhandle_t q, int polling, const unsigned char *rbuf, uint64_t seed)
{
    int got = 0;
    double recv_at = 0;
    while (got != 3) {
        exs_event_t ev = next(q, polling);
        if (ev.context == ctx_of(1)) {
            recv_at = now_us();
            got |= 1;
        } else {
            got |= 2;
        }
    }
    CHECK(verify(rbuf, LEN, seed) == LEN, "bytes differ");
    return recv_at;
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
    struct opts o = parse_opts(argc, argv, server ? 4 : 3);
    if (server) {
        if (argc < 4)
            usage(argv[0]);
        l = listen_on(argv[2], argv[3]);
        s = accept_one(l, q);
    } else {
        s = exs_socket(AF_UNSPEC, EXS_SOCK_SEQPACKET, 0);
        OK(s);
        /* The connection uses the smaller of the two sides' settings (exs.h), so the
         * client's alone decides here. */
        if (o.small >= 0)
            OK(exs_fcntl(s, EXS_F_SET_SMALL_PACKET_MAX, (int)o.small));
        connect_to(s, argv[2], q);
    }
    uint64_t total = (uint64_t)(o.warm + o.rounds);
    double *t = malloc((size_t)o.rounds * sizeof *t);
    CHECK(t != NULL, "%s", "malloc");
    double median[2];
    for (int phase = 0; phase < 2; phase++) {
        int polling = o.poll_first ? !phase : phase;
        /* The server keeps a recv posted for the next ping, as `ferry bench exs`'s peer
         * does: re-posted as soon as a ping is in, before the answer goes out. */
        int ping_in = 0;
        if (server)
            OK(exs_recv(s, rbuf, LEN, 0, rmh, q, ctx_of(1)));
        for (uint64_t r = 0; r < total; r++) {
            uint64_t seed = 2 * r + (uint64_t)server;
            fill(sbuf, LEN, seed);
            double t0 = now_us(), t1 = 0;
            if (server) {
                /* Answer once the ping is in (it may have come while the last answer's
                 * send completed). */
                if (!ping_in) {
                    exs_event_t ev = next(q, polling);
                    CHECK(ev.context == ctx_of(1), "expected the recv");
                }
                ping_in = 0;
                CHECK(verify(rbuf, LEN, seed - 1) == LEN, "bytes differ");
                if (r + 1 < total)
                    OK(exs_recv(s, rbuf, LEN, 0, rmh, q, ctx_of(1)));
                OK(exs_send(s, sbuf, LEN, 0, smh, q, ctx_of(2)));
                for (;;) {
                    exs_event_t ev = next(q, polling);
                    if (ev.context == ctx_of(2))
                        break;
                    CHECK(ev.context == ctx_of(1) && !ping_in, "%s", "unexpected event");
                    ping_in = 1;
                }
            } else {
                OK(exs_recv(s, rbuf, LEN, 0, rmh, q, ctx_of(1)));
                OK(exs_send(s, sbuf, LEN, 0, smh, q, ctx_of(2)));
                t1 = round_done(q, polling, rbuf, seed + 1);
            }
            if (server)
                t1 = now_us();
            if (r >= (uint64_t)o.warm)
                t[r - (uint64_t)o.warm] = (t1 - t0) / 2;
        }
        qsort(t, (size_t)o.rounds, sizeof t[0], cmp);
        median[polling] = t[o.rounds / 2];
    }
    free(t);
    /* The suite's bound; a bench run (its arguments given) reports the two medians and
     * leaves judging them to its targets, so a burst on a loaded host costs no data. */
    if (argc == (server ? 4 : 3))
        CHECK(median[1] <= 3 * median[0] + 200, "polling %.1f us against blocking %.1f us",
              median[1], median[0]);
    if (!server)
        printf("%s: one-way latency, %d B, median of %ld: blocking %.2f us, polling %.2f us\n",
               g_role, LEN, o.rounds, median[0], median[1]);
    if (server) {
        wait_event(q, EXS_EVT_CLOSE, NULL);
        OK(exs_close(s));
        OK(exs_close(l));
    } else {
        OK(exs_close(s));
    }
    return 0;
}
