#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets into seeds/<target>/ (run from fuzz/).

Frames follow core/PROTOCOL.md: postcard message, CRC-32 (little-endian) of it, COBS,
0x00 delimiter. Images need no seeds: mount_image starts from a valid image it makes
with the real log and reads its input as a list of edits.
"""
import os
import struct
import zlib


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def s(text):
    b = text.encode() if isinstance(text, str) else text
    return varint(len(b)) + b


def opt(v):
    return b"\x00" if v is None else b"\x01" + v


def cobs(data):
    out, block = bytearray(), bytearray()
    for byte in data:
        if byte == 0:
            out += bytes([len(block) + 1]) + block
            block = bytearray()
        else:
            block.append(byte)
            if len(block) == 254:
                out += bytes([255]) + block
                block = bytearray()
    out += bytes([len(block) + 1]) + block
    return bytes(out)


def frame(msg):
    return cobs(msg + struct.pack("<I", zlib.crc32(msg))) + b"\x00"


def hello(version=2, name="seed"):
    return varint(0) + varint(version) + s(name)


def publish(seq, topic, payload, ack=2, producer=None, ts=1_764_000_000_000_000):
    p = None if producer is None else varint(producer[0]) + varint(producer[1])
    return (varint(1) + varint(seq) + s(topic) + opt(varint(ts)) + s(payload)
            + varint(ack) + opt(p))


def fetch(seq, offset, max_bytes=512, consumer=None, wait=None):
    return (varint(2) + varint(seq) + opt(None if consumer is None else s(consumer))
            + varint(offset) + varint(max_bytes) + opt(None if wait is None else varint(wait)))


def commit(seq, consumer, offset):
    return varint(3) + varint(seq) + s(consumer) + varint(offset)


def open_session(seq, producer_id, resume=False):
    return varint(7) + varint(seq) + varint(producer_id) + (b"\x01" if resume else b"\x00")


def session_publish(seq, topic, payload, producer_id, epoch, pseq, ack=2, ts=1_764_000_000_000_000):
    return (varint(8) + varint(seq) + s(topic) + opt(varint(ts)) + s(payload) + varint(ack)
            + varint(producer_id) + varint(epoch) + varint(pseq))


def find_offset(seq, timestamp_us, from_offset=0):
    return varint(9) + varint(seq) + varint(timestamp_us) + varint(from_offset)


def write(target, name, data):
    os.makedirs(f"seeds/{target}", exist_ok=True)
    with open(f"seeds/{target}/{name}", "wb") as f:
        f.write(data)


# wire_gateway: first byte picks the read size.
session = b"".join(frame(m) for m in [
    hello(),
    publish(1, "sensor/t", b"21.5"),
    publish(2, "sensor/t", b"21.6", ack=1, producer=(7, 0)),
    publish(3, "sensor/t", b"21.6", ack=1, producer=(7, 0)),
    publish(4, "s", b"x" * 300, ack=0),
    fetch(5, 0),
    commit(6, "bridge", 2),
    fetch(7, 0, consumer="bridge", wait=10),
    varint(4) + varint(8),
    varint(5) + varint(9) + s("bridge"),
    varint(6) + varint(10),
])
write("wire_gateway", "session", b"\x07" + session)
write("wire_gateway", "session_bytewise", b"\x00" + session)
write("wire_gateway", "v1_client", b"\x20" + frame(hello(1)) + frame(publish(1, "t", b"v1", ack=3)))
write("wire_gateway", "no_hello", b"\x10" + frame(publish(1, "t", b"p")) + frame(fetch(2, 1 << 62)))
# Version 3: producer sessions (open, publish in order, resend, out of order, fenced by a
# newer session, an epoch never handed out, resume) and a Hello with a credential.
v3 = b"".join(frame(m) for m in [
    hello(3) + b"\x00",
    open_session(1, 7),
    session_publish(2, "s/t", b"a1", 7, 1, 1),
    session_publish(3, "s/t", b"a2", 7, 1, 2),
    session_publish(4, "s/t", b"a2", 7, 1, 2),
    session_publish(5, "s/t", b"a9", 7, 1, 9),
    open_session(6, 7),
    session_publish(7, "s/t", b"a3", 7, 1, 3),
    session_publish(8, "s/t", b"b1", 7, 2, 1),
    session_publish(9, "s/t", b"x", 7, 99, 1),
    open_session(10, 7, resume=True),
    session_publish(11, "s/t", b"b2", 7, 2, 0xFFFFFFFF),
    publish(12, "s/t", b"plain", producer=(7, 5)),
])
write("wire_gateway", "v3_sessions", b"\x09" + v3)
write("wire_gateway", "v3_sessions_bytewise", b"\x00" + v3)
write("wire_gateway", "v3_credential", b"\x11" + frame(hello(3) + b"\x01" + s("token")) + frame(open_session(1, 1)))
# Version 4: the offset of a time (before every record, in the middle, past the end, from
# an offset past the end), and the same request from a version 3 client.
v4 = b"".join(frame(m) for m in [
    hello(4) + b"\x00",
    publish(1, "s/t", b"a", ts=1_764_000_000_000_000),
    publish(2, "s/t", b"b", ts=1_763_000_000_000_000),
    publish(3, "s/t", b"c", ts=1_765_000_000_000_000),
    find_offset(4, 0),
    find_offset(5, 1_764_500_000_000_000),
    find_offset(6, 1_764_500_000_000_000, 1),
    find_offset(7, 1 << 63),
    find_offset(8, 0, 1 << 40),
])
write("wire_gateway", "v4_find_offset", b"\x09" + v4)
write("wire_gateway", "v3_find_offset", b"\x09" + frame(hello(3) + b"\x00") + frame(find_offset(1, 0)))
write("wire_gateway", "garbage", b"\x03\x00\x01\x02\xff\x00\x05abcd\x00")

# lines: bit 6 of the first byte is a fixed topic, the rest the read size.
write("lines", "topics", b"\x05temp 21.5\nhum\t40\r\n\n  \nlonely\n" + b"big " + b"y" * 200 + b"\nend 1")
write("lines", "fixed_topic", b"\x42raw line one\nraw line two\r\n\xff\xfe\n")

# config_toml: the keys of `spillway run`.
write("config_toml", "full", b"""image = "g.img"
size = "1M"
erase-size = "4K"
write-size = "4"
listen = ["tcp://127.0.0.1:7878", "unix:///run/spillway.sock?mode=lines&topic=t"]
serial = ["serial:///dev/ttyS1?baud=115200"]
metrics = "127.0.0.1:9100"
ack = "durable"
spill = "on-pressure"
full = "drop-oldest"
linger-ms = 50
buffer-bytes = "64K"
max-record-bytes = "4K"
gateway-id = "gw-1"
max-connections = 16
""")
write("config_toml", "small", b'size = 65536\nerase-size = 1024\nbuffer-bytes = "8K"\n')

# bridge_reply: one frame each.
welcome = varint(0) + varint(2) + varint(0x0102_0304_0506_0708_090A) + s("gw") + varint(4096) + varint(65536)
write("bridge_reply", "welcome", frame(welcome))
write("bridge_reply", "ack", frame(varint(1) + varint(3) + varint(41) + b"\x00"))
write("bridge_reply", "error", frame(varint(2) + varint(3) + varint(4) + s("full")))
rec = lambda off: (varint(off) + varint(0xDEADBEEF) + s("sensor/t") + varint(1_764_000_000_000_000)
                   + opt(varint(7) + varint(off)) + s(b"21.5"))
block = rec(10) + rec(11)
write("bridge_reply", "records", frame(varint(3) + varint(5) + varint(0x1234) + varint(12)
                                       + opt(None) + varint(2) + varint(len(block)) + block))
lost = varint(3) + varint(2) + b"\x01"
write("bridge_reply", "records_lost", frame(varint(3) + varint(6) + varint(0) + varint(3)
                                            + opt(lost) + varint(0) + varint(0)))
write("bridge_reply", "dropped", frame(varint(4) + varint(7) + varint(100)))
write("bridge_reply", "committed", frame(varint(5) + varint(8) + s("bridge") + varint(12)))
entry = s("bridge") + varint(12)
write("bridge_reply", "consumers", frame(varint(6) + varint(9) + varint(1) + varint(len(entry)) + entry))
write("bridge_reply", "found_offset", frame(varint(10) + varint(11) + varint(4096) + b"\x00"))
write("bridge_reply", "stats", frame(varint(8) + varint(10) + b"".join(varint(i * 3) for i in range(20))))
