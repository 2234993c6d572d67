/*
 * Blast: the client streams COUNT messages of MSG bytes with WINDOW sends in flight; the
 * server keeps WINDOW recvs posted, checks every message's bytes (each one's pattern
 * follows from its sequence number, and messages arrive in order), and at the end sends
 * back its count and checksum, which the client compares with its own.
 *
 *   blast server LISTEN_URL ADDR_FILE     blast client ADDR
 */
#define _POSIX_C_SOURCE 200809L
#include "common.h"

#define COUNT 2000
#define MSG (64 * 1024)
#define WINDOW 8

/* FNV-1a over every byte received, in order. */
static uint64_t fnv(uint64_t h, const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

int main(int argc, char **argv)
{
    if (argc < 3)
        usage(argv[0]);
    int server = strcmp(argv[1], "server") == 0;
    g_role = server ? "blast server" : "blast client";
    OK(exs_init(EXS_VERSION));
    exs_qhandle_t q = exs_qcreate(WINDOW * 2);
    OK(q);
    unsigned char *slots = alloc_mem((size_t)WINDOW * MSG);
    exs_mhandle_t mh = exs_mregister(slots, (size_t)WINDOW * MSG, 0);
    OK(mh);
    uint64_t summary[2] = {0, 0}; /* count, checksum */
    exs_mhandle_t smh = exs_mregister(summary, sizeof summary, 0);
    OK(smh);
    uint64_t sum = 0xcbf29ce484222325ull;

    int s, l = -1;
    if (server) {
        if (argc != 4)
            usage(argv[0]);
        l = listen_on(argv[2], argv[3]);
        s = accept_one(l, q);
        uint64_t got = 0;
        /* Slot i receives message i, i + WINDOW, ... (recvs match messages in order). */
        for (uintptr_t i = 0; i < WINDOW && i < COUNT; i++)
            OK(exs_recv(s, slots + i * MSG, MSG, 0, mh, q, ctx_of(i)));
        while (got < COUNT) {
            /* Recvs match messages in the order they were posted: message `got` is in slot
             * got % WINDOW, whatever order the completions come in. */
            uintptr_t slot = (uintptr_t)(got % WINDOW);
            exs_event_t ev = wait_ok(q, EXS_EVT_RECV, ctx_of(slot));
            CHECK(ev.buf == slots + slot * MSG && ev.len == MSG, "message %llu: %zu bytes",
                  (unsigned long long)got, ev.len);
            CHECK(verify(ev.buf, MSG, got) == MSG, "message %llu: bytes differ", (unsigned long long)got);
            sum = fnv(sum, ev.buf, MSG);
            got++;
            if (got + WINDOW - 1 < COUNT)
                OK(exs_recv(s, ev.buf, MSG, 0, mh, q, ctx_of(slot)));
        }
        summary[0] = got;
        summary[1] = sum;
        OK(exs_send(s, summary, sizeof summary, 0, smh, q, ctx_of(99)));
        wait_ok(q, EXS_EVT_SEND, ctx_of(99));
        exs_event_t ev = wait_event(q, EXS_EVT_CLOSE, NULL);
        CHECK(ev.sock == s, "close event for %d", ev.sock);
        OK(exs_close(s));
        OK(exs_close(l));
        printf("%s: %d messages of %d bytes verified, checksum %016llx\n", g_role, COUNT, MSG,
               (unsigned long long)sum);
    } else {
        s = exs_socket(AF_UNSPEC, EXS_SOCK_SEQPACKET, 0);
        OK(s);
        connect_to(s, argv[2], q);
        OK(exs_recv(s, summary, sizeof summary, 0, smh, q, ctx_of(99)));
        uint64_t next = 0, done = 0;
        for (uintptr_t i = 0; i < WINDOW && next < COUNT; i++, next++) {
            fill(slots + i * MSG, MSG, next);
            sum = fnv(sum, slots + i * MSG, MSG);
            OK(exs_send(s, slots + i * MSG, MSG, 0, mh, q, ctx_of(i)));
        }
        while (done < COUNT) {
            exs_event_t ev = wait_ok(q, EXS_EVT_SEND, ctx_of(done % WINDOW));
            CHECK(ev.len == MSG, "send %llu: %zu bytes", (unsigned long long)done, ev.len);
            done++;
            if (next < COUNT) {
                unsigned char *b = ev.buf;
                fill(b, MSG, next);
                sum = fnv(sum, b, MSG);
                OK(exs_send(s, b, MSG, 0, mh, q, ev.context));
                next++;
            }
        }
        wait_ok(q, EXS_EVT_RECV, ctx_of(99));
        CHECK(summary[0] == COUNT, "server counted %llu", (unsigned long long)summary[0]);
        CHECK(summary[1] == sum, "checksums differ: server %016llx, client %016llx",
              (unsigned long long)summary[1], (unsigned long long)sum);
        OK(exs_close(s));
        wait_event(q, EXS_EVT_CLOSE, NULL);
        printf("%s: %d messages sent, checksums agree\n", g_role, COUNT);
    }
    OK(exs_mderegister(mh));
    OK(exs_mderegister(smh));
    OK(exs_qdelete(q));
    free(slots);
    return 0;
}
