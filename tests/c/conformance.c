/*
 * An independent client of the Spillway wire protocol, written from core/PROTOCOL.md
 * alone: its own COBS, CRC-32, varints and message layouts, no Spillway code, no malloc
 * (every buffer is static and bounded). It checks a running gateway against the document:
 *
 *   conformance HOST PORT
 *
 * handshake and version negotiation, a bad frame and an oversize frame answered under
 * seq 0 on a connection that stays open, NotHandshaken, a producer session with pipelined
 * publishes whose replies are matched by seq, a resend answered as a duplicate with its
 * original offset, fetches whose records and record CRCs (and the prev_crc chain) match
 * what was sent, consumers (the pre-registered `bridge`, commit, list, delete), Stats.
 * Prints one line per check; exits 0 when every check passed, 1 at the first that did
 * not (naming it), 2 on a usage error.
 *
 * Built by scripts/test.sh with the system C compiler (cc -std=c99 -Wall -Wextra
 * -pedantic -Werror) and run by tests/tests/conformance_c.rs against the real gateway.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <unistd.h>
#include <netdb.h>
#include <sys/socket.h>
#include <sys/time.h>

/* Largest frame this client can take, bytes on the wire. The gateway's Welcome must not
 * announce more (checked). */
#define FRAME_MAX 70000
/* Largest message (postcard bytes) this client builds or decodes. */
#define MSG_MAX 69000

static const char *step = "start";

static void fail(const char *why) {
    fprintf(stderr, "FAIL [%s]: %s\n", step, why);
    exit(1);
}

static void check(int ok, const char *what) {
    if (!ok) fail(what);
}

static void pass(const char *what) { printf("ok   %s\n", what); }

/* ---- CRC-32/IEEE (PROTOCOL.md §1): reflected 0xEDB88320, init and final XOR ~0 ---- */

static uint32_t crc_table[256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[i] = c;
    }
}

static uint32_t crc_update(uint32_t crc, const uint8_t *p, size_t n) {
    crc = ~crc;
    while (n--) crc = crc_table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

/* ---- COBS (§1) ---- */

/* Encodes n bytes of in into out (capacity cap), without the delimiter; returns the
 * length, or 0 if it does not fit. */
static size_t cobs_encode(const uint8_t *in, size_t n, uint8_t *out, size_t cap) {
    size_t o = 1, code_at = 0;
    uint8_t code = 1;
    if (cap == 0) return 0;
    for (size_t i = 0; i < n; i++) {
        if (in[i] == 0) {
            out[code_at] = code;
            code = 1;
            code_at = o++;
            if (o > cap) return 0;
        } else {
            if (o >= cap) return 0;
            out[o++] = in[i];
            code++;
            if (code == 0xFF) {
                out[code_at] = code;
                code = 1;
                code_at = o++;
                if (o > cap) return 0;
            }
        }
    }
    out[code_at] = code;
    return o;
}

/* Decodes n COBS bytes in place into out (capacity cap); returns the length or -1. */
static long cobs_decode(const uint8_t *in, size_t n, uint8_t *out, size_t cap) {
    size_t i = 0, o = 0;
    while (i < n) {
        uint8_t c = in[i++];
        if (c == 0) return -1;
        for (uint8_t k = 1; k < c; k++) {
            if (i >= n || o >= cap) return -1;
            out[o++] = in[i++];
        }
        if (c != 0xFF && i < n) {
            if (o >= cap) return -1;
            out[o++] = 0;
        }
    }
    return (long)o;
}

/* ---- postcard writing (§2) ---- */

typedef struct {
    uint8_t b[MSG_MAX];
    size_t n;
} msg_t;

static void put_u8(msg_t *m, uint8_t v) {
    check(m->n < sizeof m->b, "message too long");
    m->b[m->n++] = v;
}

static void put_varint(msg_t *m, uint64_t v) {
    do {
        uint8_t b = v & 0x7f;
        v >>= 7;
        put_u8(m, (uint8_t)(b | (v ? 0x80 : 0)));
    } while (v);
}

static void put_bytes(msg_t *m, const void *p, size_t n) {
    put_varint(m, n);
    check(m->n + n <= sizeof m->b, "message too long");
    memcpy(m->b + m->n, p, n);
    m->n += n;
}

static void put_str(msg_t *m, const char *s) { put_bytes(m, s, strlen(s)); }

/* ---- postcard reading ---- */

typedef struct {
    const uint8_t *p;
    size_t n, at;
} rd_t;

static uint64_t get_varint(rd_t *r, int max_bytes) {
    uint64_t v = 0;
    for (int i = 0; i < max_bytes; i++) {
        check(r->at < r->n, "message ends inside a varint");
        uint8_t b = r->p[r->at++];
        if (i < 10) v |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) return v;
    }
    fail("varint too long");
    return 0;
}

static uint64_t get_u64(rd_t *r) { return get_varint(r, 10); }
static uint32_t get_u32(rd_t *r) {
    uint64_t v = get_varint(r, 5);
    check(v <= 0xffffffffu, "u32 out of range");
    return (uint32_t)v;
}

static int get_bool(rd_t *r) {
    check(r->at < r->n, "message ends inside a bool");
    uint8_t b = r->p[r->at++];
    check(b <= 1, "bool is neither 0 nor 1");
    return b;
}

/* A byte string or str: its bytes stay in the message. */
static const uint8_t *get_bytes(rd_t *r, size_t *len) {
    uint64_t n = get_varint(r, 10);
    check(n <= r->n - r->at, "length past the end of the message");
    const uint8_t *p = r->p + r->at;
    r->at += (size_t)n;
    *len = (size_t)n;
    return p;
}

/* ---- one connection ---- */

typedef struct {
    int fd;
    uint8_t rx[FRAME_MAX];
    size_t rx_len;
    uint8_t msg[FRAME_MAX];
    size_t msg_len;
} conn_t;

static conn_t conn_a, conn_b;
static uint8_t frame_buf[FRAME_MAX + 8];

static void conn_open(conn_t *c, const char *host, const char *port) {
    struct addrinfo hints, *res;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    check(getaddrinfo(host, port, &hints, &res) == 0, "cannot resolve the gateway");
    c->fd = socket(res->ai_family, res->ai_socktype, res->ai_protocol);
    check(c->fd >= 0, "socket");
    check(connect(c->fd, res->ai_addr, res->ai_addrlen) == 0, "cannot connect");
    freeaddrinfo(res);
    struct timeval tv = {10, 0};
    setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    c->rx_len = 0;
}

static void send_all(conn_t *c, const uint8_t *p, size_t n) {
    while (n) {
        ssize_t k = send(c->fd, p, n, 0);
        check(k > 0, "send failed");
        p += k;
        n -= (size_t)k;
    }
}

/* Sends message m as a frame: COBS(m ‖ CRC32(m) little endian) ‖ 0x00. */
static void send_msg(conn_t *c, const msg_t *m) {
    static uint8_t body[MSG_MAX + 4];
    uint32_t crc = crc_update(0, m->b, m->n);
    memcpy(body, m->b, m->n);
    for (int i = 0; i < 4; i++) body[m->n + i] = (uint8_t)(crc >> (8 * i));
    size_t n = cobs_encode(body, m->n + 4, frame_buf, FRAME_MAX);
    check(n > 0, "frame does not fit");
    frame_buf[n++] = 0;
    send_all(c, frame_buf, n);
}

/* Receives the next good frame's message into c->msg (bad frames from the gateway are
 * dropped, as §1 says a client does). */
static rd_t recv_msg(conn_t *c) {
    for (;;) {
        uint8_t *z = memchr(c->rx, 0, c->rx_len);
        if (z) {
            size_t flen = (size_t)(z - c->rx);
            long n = flen ? cobs_decode(c->rx, flen, c->msg, sizeof c->msg) : -1;
            memmove(c->rx, z + 1, c->rx_len - flen - 1);
            c->rx_len -= flen + 1;
            if (n >= 5) {
                size_t len = (size_t)n - 4;
                uint32_t want = crc_update(0, c->msg, len);
                uint32_t got = (uint32_t)c->msg[len] | (uint32_t)c->msg[len + 1] << 8 |
                               (uint32_t)c->msg[len + 2] << 16 | (uint32_t)c->msg[len + 3] << 24;
                if (want == got) {
                    c->msg_len = len;
                    rd_t r = {c->msg, len, 0};
                    return r;
                }
            }
            continue;
        }
        check(c->rx_len < sizeof c->rx, "a frame larger than this client's buffer");
        ssize_t k = recv(c->fd, c->rx + c->rx_len, sizeof c->rx - c->rx_len, 0);
        check(k > 0, k == 0 ? "the gateway closed the connection" : "no reply within 10 s");
        c->rx_len += (size_t)k;
    }
}

/* ---- requests ---- */

enum { REQ_HELLO, REQ_PUBLISH, REQ_FETCH, REQ_COMMIT, REQ_LIST, REQ_DELETE, REQ_STATS,
       REQ_OPEN_SESSION, REQ_SESSION_PUBLISH };
enum { RSP_WELCOME, RSP_ACK, RSP_ERROR, RSP_RECORDS, RSP_DROPPED, RSP_COMMITTED,
       RSP_CONSUMERS, RSP_DELETED, RSP_STATS, RSP_SESSION };
enum { ACK_NONE, ACK_BUFFERED, ACK_DURABLE };
enum { E_TOO_LARGE = 0, E_BAD_FRAME = 2, E_UNSUPPORTED_VERSION = 3, E_NOT_HANDSHAKEN = 10 };

typedef struct {
    uint16_t version;
    uint32_t max_record, max_frame, window;
} welcome_t;

static void hello(conn_t *c, uint16_t version) {
    msg_t m = {{0}, 0};
    put_u8(&m, REQ_HELLO);
    put_varint(&m, version);
    put_str(&m, "c-conformance");
    if (version >= 3) put_u8(&m, 0); /* credential: None */
    send_all(c, (const uint8_t *)"", 1); /* a 0x00 first ends any noise (§1) */
    send_msg(c, &m);
}

static welcome_t expect_welcome(conn_t *c) {
    welcome_t w;
    size_t len;
    rd_t r = recv_msg(c);
    check(get_varint(&r, 5) == RSP_WELCOME, "expected Welcome");
    w.version = (uint16_t)get_varint(&r, 3);
    (void)get_varint(&r, 19); /* log_id, u128 */
    (void)get_bytes(&r, &len); /* gateway_id */
    w.max_record = get_u32(&r);
    w.max_frame = get_u32(&r);
    w.window = w.version >= 3 ? get_u32(&r) : 0;
    return w;
}

/* The text of the last Error received (NUL-terminated, cut to fit). */
static char error_text[256];

/* An Error reply: its seq and code. */
static void expect_error(conn_t *c, uint32_t seq, uint32_t code) {
    size_t len;
    rd_t r = recv_msg(c);
    check(get_varint(&r, 5) == RSP_ERROR, "expected Error");
    check(get_u32(&r) == seq, "Error under the wrong seq");
    uint32_t got = get_u32(&r);
    const uint8_t *text = get_bytes(&r, &len);
    snprintf(error_text, sizeof error_text, "%.*s", (int)len, (const char *)text);
    if (got != code) {
        fprintf(stderr, "error code %u (%.*s), expected %u\n", got, (int)len, text, code);
        fail("wrong error code");
    }
}

typedef struct {
    uint64_t first, next, durable, appended, duplicates;
} stats_t;

static stats_t stats(conn_t *c, uint32_t seq) {
    msg_t m = {{0}, 0};
    stats_t s;
    put_u8(&m, REQ_STATS);
    put_varint(&m, seq);
    send_msg(c, &m);
    rd_t r = recv_msg(c);
    check(get_varint(&r, 5) == RSP_STATS, "expected StatsReply");
    check(get_u32(&r) == seq, "StatsReply under the wrong seq");
    s.first = get_u64(&r);
    s.next = get_u64(&r);
    s.durable = get_u64(&r);
    s.appended = get_u64(&r);
    (void)get_u64(&r); /* bytes_appended */
    s.duplicates = get_u64(&r);
    for (int i = 6; i < 25; i++) (void)get_u64(&r);
    return s;
}

#define TOPIC "c/conformance"
#define NREC 6

static const char *payload(int i) {
    static char buf[NREC][32];
    snprintf(buf[i], sizeof buf[i], "reading %d: %d.%d", i + 1, 18 + i, i * 7 % 10);
    return buf[i];
}

static void session_publish(conn_t *c, uint32_t seq, uint64_t id, uint32_t epoch,
                            uint32_t pseq, const char *pl, int ack) {
    msg_t m = {{0}, 0};
    put_u8(&m, REQ_SESSION_PUBLISH);
    put_varint(&m, seq);
    put_str(&m, TOPIC);
    put_u8(&m, 1); /* timestamp_us: Some */
    put_varint(&m, 1700000000000000ull + pseq);
    put_str(&m, pl);
    put_u8(&m, (uint8_t)ack);
    put_varint(&m, id);
    put_varint(&m, epoch);
    put_varint(&m, pseq);
    send_msg(c, &m);
}

/* The record CRC of §4 `Records`: offset (8 bytes LE) then the record as the log stores
 * it (topic_len, topic, timestamp LE 8, flags, [id LE 8, seq LE 4], payload_len LE 4,
 * payload). */
static uint32_t record_crc(uint64_t offset, const uint8_t *topic, size_t tlen, uint64_t ts,
                           int has_producer, uint64_t id, uint32_t pseq,
                           const uint8_t *pl, size_t plen) {
    uint8_t b[8];
    uint32_t crc;
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(offset >> (8 * i));
    crc = crc_update(0, b, 8);
    b[0] = (uint8_t)tlen;
    crc = crc_update(crc, b, 1);
    crc = crc_update(crc, topic, tlen);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(ts >> (8 * i));
    crc = crc_update(crc, b, 8);
    b[0] = has_producer ? 1 : 0;
    crc = crc_update(crc, b, 1);
    if (has_producer) {
        for (int i = 0; i < 8; i++) b[i] = (uint8_t)(id >> (8 * i));
        crc = crc_update(crc, b, 8);
        for (int i = 0; i < 4; i++) b[i] = (uint8_t)(pseq >> (8 * i));
        crc = crc_update(crc, b, 4);
    }
    for (int i = 0; i < 4; i++) b[i] = (uint8_t)((uint32_t)plen >> (8 * i));
    crc = crc_update(crc, b, 4);
    return crc_update(crc, pl, plen);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s HOST PORT\n", argv[0]);
        return 2;
    }
    crc_init();
    {
        static const uint8_t check_in[] = "123456789";
        step = "crc";
        check(crc_update(0, check_in, 9) == 0xCBF43926u, "CRC-32 check value");
    }
    conn_t *a = &conn_a, *b = &conn_b;

    /* Requests before the handshake: NotHandshaken under seq 0. */
    step = "before hello";
    conn_open(a, argv[1], argv[2]);
    {
        msg_t m = {{0}, 0};
        put_u8(&m, REQ_STATS);
        put_varint(&m, 7);
        send_msg(a, &m);
        expect_error(a, 0, E_NOT_HANDSHAKEN);
    }
    pass("a request before Hello gets NotHandshaken under seq 0");

    /* Version 0 is refused and the connection stays open; 65535 gets 5, the newest. */
    step = "version negotiation";
    hello(a, 0);
    expect_error(a, 0, E_UNSUPPORTED_VERSION);
    hello(a, 65535);
    welcome_t w = expect_welcome(a);
    check(w.version == 5, "Hello 65535 is not answered with version 5");
    check(w.max_frame <= FRAME_MAX, "max_frame_bytes larger than this client's buffer");
    check(w.max_record > 0 && w.window > 0, "Welcome fields");
    pass("Hello 0 gets UnsupportedVersion on an open connection; Hello 65535 gets 5");

    /* A second Hello renegotiates. */
    step = "second hello";
    conn_open(b, argv[1], argv[2]);
    hello(b, 1);
    check(expect_welcome(b).version == 1, "Hello 1 is not answered with version 1");
    hello(b, 3);
    check(expect_welcome(b).version == 3, "a second Hello is not answered with a Welcome");
    pass("a second Hello is answered with a new Welcome");

    /* A frame with a bad CRC: BadFrame under seq 0, the connection stays usable. */
    step = "bad frame";
    {
        static const uint8_t bad[] = {0x06, 0x06, 0x01, 0x11, 0x22, 0x33, 0x00};
        send_all(a, bad, sizeof bad);
        expect_error(a, 0, E_BAD_FRAME);
    }
    stats_t s0 = stats(a, 1);
    pass("a frame with a bad CRC gets BadFrame under seq 0; the connection goes on");

    /* A frame over max_frame_bytes: TooLarge under seq 0. */
    step = "oversize frame";
    {
        static uint8_t big[FRAME_MAX + 2];
        size_t n = (size_t)w.max_frame + 1;
        memset(big, 0x01, n);
        big[n] = 0;
        send_all(a, big, n + 1);
        expect_error(a, 0, E_TOO_LARGE);
        char limit[32];
        snprintf(limit, sizeof limit, "%u", (unsigned)w.max_frame);
        check(strstr(error_text, limit) != NULL,
              "the TooLarge message does not name the Welcome's max_frame_bytes");
        (void)stats(a, 2);
    }
    pass("a frame over max_frame_bytes gets TooLarge under seq 0 naming that limit; the connection goes on");

    /* A producer session. */
    step = "open session";
    uint64_t id = 0xC0DE0000ull + (uint64_t)getpid();
    uint32_t epoch;
    {
        msg_t m = {{0}, 0};
        put_u8(&m, REQ_OPEN_SESSION);
        put_varint(&m, 3);
        put_varint(&m, id);
        put_u8(&m, 0); /* resume: false */
        send_msg(a, &m);
        rd_t r = recv_msg(a);
        check(get_varint(&r, 5) == RSP_SESSION, "expected Session");
        check(get_u32(&r) == 3, "Session under the wrong seq");
        check(get_u64(&r) == id, "Session names another producer id");
        epoch = get_u32(&r);
        check(epoch >= 1, "epoch 0");
        check(get_u32(&r) == 0, "a new session has a last_seq");
        check(get_bool(&r) == 0, "a new session says resumed");
    }
    pass("OpenSession opens a new session");

    /* Pipelined publishes, durable and buffered, and a Stats among them: every reply is
     * matched by its seq, in whatever order it comes. */
    step = "pipelined publishes";
    uint64_t offsets[NREC];
    {
        int got[NREC + 1] = {0};
        for (int i = 0; i < NREC; i++) {
            session_publish(a, 100 + (uint32_t)i, id, epoch, (uint32_t)i + 1, payload(i),
                            i % 2 ? ACK_BUFFERED : ACK_DURABLE);
            if (i == 2) {
                msg_t m = {{0}, 0};
                put_u8(&m, REQ_STATS);
                put_varint(&m, 200);
                send_msg(a, &m);
            }
        }
        for (int k = 0; k < NREC + 1; k++) {
            rd_t r = recv_msg(a);
            uint64_t v = get_varint(&r, 5);
            uint32_t seq = get_u32(&r);
            if (v == RSP_STATS) {
                check(seq == 200 && !got[NREC], "StatsReply under an unexpected seq");
                got[NREC] = 1;
                continue;
            }
            check(v == RSP_ACK, "expected Ack");
            check(seq >= 100 && seq < 100 + NREC && !got[seq - 100], "Ack under an unexpected seq");
            got[seq - 100] = 1;
            offsets[seq - 100] = get_u64(&r);
            check(get_bool(&r) == 0, "a new record acknowledged as a duplicate");
        }
        for (int i = 1; i < NREC; i++)
            check(offsets[i] == offsets[i - 1] + 1, "offsets do not follow the sequences");
        check(offsets[0] == s0.next, "the first offset is not Stats' next_offset");
    }
    pass("pipelined session publishes are acknowledged, matched by seq, in sequence order");

    /* A resend of a stored sequence: a duplicate with its original offset, stored once. */
    step = "resend";
    {
        session_publish(a, 300, id, epoch, NREC, payload(NREC - 1), ACK_DURABLE);
        rd_t r = recv_msg(a);
        check(get_varint(&r, 5) == RSP_ACK, "expected Ack for the resend");
        check(get_u32(&r) == 300, "Ack under the wrong seq");
        check(get_u64(&r) == offsets[NREC - 1], "the resend got another offset");
        check(get_bool(&r) == 1, "the resend is not marked duplicate");
        stats_t s1 = stats(a, 301);
        check(s1.next == offsets[NREC - 1] + 1, "the resend was stored again");
        check(s1.duplicates >= s0.duplicates + 1, "duplicates not counted");
    }
    pass("a resend is answered as a duplicate with its original offset and not stored");

    /* Fetch: the records as sent, their record CRCs, and the prev_crc chain. */
    step = "fetch";
    uint32_t first_crc = 0;
    {
        msg_t m = {{0}, 0};
        size_t len;
        put_u8(&m, REQ_FETCH);
        put_varint(&m, 400);
        put_u8(&m, 0); /* consumer: None */
        put_varint(&m, offsets[0]);
        put_varint(&m, 65536);
        put_u8(&m, 0); /* wait_ms: None */
        send_msg(a, &m);
        rd_t r = recv_msg(a);
        check(get_varint(&r, 5) == RSP_RECORDS, "expected Records");
        check(get_u32(&r) == 400, "Records under the wrong seq");
        (void)get_u32(&r); /* prev_crc */
        uint64_t next = get_u64(&r);
        check(get_bool(&r) == 0, "a lost range where none is expected");
        uint32_t count = get_u32(&r);
        size_t block_len;
        const uint8_t *block = get_bytes(&r, &block_len);
        check(count == NREC && next == offsets[NREC - 1] + 1, "not every record came back");
        rd_t br = {block, block_len, 0};
        for (uint32_t i = 0; i < count; i++) {
            uint64_t off = get_u64(&br);
            uint32_t crc = get_u32(&br);
            size_t tlen, plen;
            const uint8_t *topic = get_bytes(&br, &tlen);
            uint64_t ts = get_u64(&br);
            int has_producer = get_bool(&br);
            uint64_t pid = 0;
            uint32_t pseq = 0;
            if (has_producer) {
                pid = get_u64(&br);
                pseq = get_u32(&br);
            }
            const uint8_t *pl = get_bytes(&br, &plen);
            check(off == offsets[i], "record offset");
            check(tlen == strlen(TOPIC) && !memcmp(topic, TOPIC, tlen), "record topic");
            check(ts == 1700000000000000ull + i + 1, "record timestamp");
            check(has_producer && pid == id && pseq == i + 1, "record producer");
            check(plen == strlen(payload((int)i)) && !memcmp(pl, payload((int)i), plen),
                  "record payload");
            uint32_t want = record_crc(off, topic, tlen, ts, has_producer, pid, pseq, pl, plen);
            check(crc == want, "record_crc is not the CRC that PROTOCOL.md describes");
            if (i == 0) first_crc = crc;
        }
        check(br.at == block_len, "bytes left in the records block");
        (void)len;
    }
    {
        msg_t m = {{0}, 0};
        put_u8(&m, REQ_FETCH);
        put_varint(&m, 401);
        put_u8(&m, 0);
        put_varint(&m, offsets[1]);
        put_varint(&m, 1); /* a soft limit: one record comes anyway */
        put_u8(&m, 0);
        send_msg(a, &m);
        rd_t r = recv_msg(a);
        check(get_varint(&r, 5) == RSP_RECORDS, "expected Records");
        check(get_u32(&r) == 401, "Records under the wrong seq");
        check(get_u32(&r) == first_crc, "prev_crc is not the record CRC of the record before");
        (void)get_u64(&r);
        check(get_bool(&r) == 0, "a lost range where none is expected");
        check(get_u32(&r) == 1, "max_bytes 1 does not return exactly one record");
    }
    pass("fetched records match what was sent, with record CRCs and the prev_crc chain");

    /* Consumers: `bridge` is pre-registered; commit, list, delete. */
    step = "consumers";
    {
        msg_t m = {{0}, 0};
        size_t len;
        put_u8(&m, REQ_COMMIT);
        put_varint(&m, 500);
        put_str(&m, "c-conf");
        put_varint(&m, offsets[2]);
        send_msg(a, &m);
        rd_t r = recv_msg(a);
        check(get_varint(&r, 5) == RSP_COMMITTED, "expected Committed");
        check(get_u32(&r) == 500, "Committed under the wrong seq");
        const uint8_t *name = get_bytes(&r, &len);
        check(len == 6 && !memcmp(name, "c-conf", 6), "Committed names another consumer");
        check(get_u64(&r) == offsets[2], "committed offset");

        m.n = 0;
        put_u8(&m, REQ_LIST);
        put_varint(&m, 501);
        send_msg(a, &m);
        r = recv_msg(a);
        check(get_varint(&r, 5) == RSP_CONSUMERS, "expected Consumers");
        check(get_u32(&r) == 501, "Consumers under the wrong seq");
        uint32_t count = get_u32(&r);
        size_t block_len;
        const uint8_t *block = get_bytes(&r, &block_len);
        rd_t br = {block, block_len, 0};
        int bridge = 0, mine = 0;
        check(count <= 8, "more than 8 consumers");
        for (uint32_t i = 0; i < count; i++) {
            name = get_bytes(&br, &len);
            uint64_t off = get_u64(&br);
            check(len >= 1 && len <= 31, "consumer name length");
            if (len == 6 && !memcmp(name, "bridge", 6)) bridge = 1;
            if (len == 6 && !memcmp(name, "c-conf", 6)) mine = off == offsets[2];
        }
        check(bridge, "no pre-registered bridge consumer");
        check(mine, "the committed consumer is not listed at its offset");

        m.n = 0;
        put_u8(&m, REQ_DELETE);
        put_varint(&m, 502);
        put_str(&m, "c-conf");
        send_msg(a, &m);
        r = recv_msg(a);
        check(get_varint(&r, 5) == RSP_DELETED, "expected Deleted");
        check(get_u32(&r) == 502, "Deleted under the wrong seq");
        check(get_bool(&r) == 1, "the consumer did not exist");
    }
    pass("the bridge consumer is pre-registered; commit, list and delete a consumer");

    close(a->fd);
    close(b->fd);
    printf("all checks passed\n");
    return 0;
}
