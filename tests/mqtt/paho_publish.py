"""Publishes COUNT messages "<client>-<n>" (n = 1..COUNT, zero-padded) to TOPIC at QOS with
a persistent session (clean session off) through paho-mqtt, reconnecting and resending for
as long as it takes, and prints "acked <payload>" for every message the gateway
acknowledged (PUBACK for QoS 1, PUBCOMP for QoS 2), "queued" once every message was handed
to paho, and "done" at the end.

Usage: paho_publish.py HOST PORT CLIENT_ID TOPIC QOS COUNT [PACE_MS [VERSION]]

PACE_MS (default 2): a pause after every 20 messages; 0 hands the whole stream to paho at
once. VERSION (default 3): 3 for MQTT 3.1.1 (clean session off), 5 for MQTT 5 (clean start
off, session expiry 1 hour).
"""

import sys
import threading
import time

import paho.mqtt.client as mqtt

host, port, client_id, topic = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
qos, count = int(sys.argv[5]), int(sys.argv[6])
pace = (int(sys.argv[7]) if len(sys.argv) > 7 else 2) / 1000
v5 = len(sys.argv) > 8 and sys.argv[8] == "5"

pending = {}  # mid -> payload, for messages not acknowledged yet
done = set()  # mids acknowledged before publish() returned them
lock = threading.Lock()
out_lock = threading.Lock()


def say(line):
    """One line on stdout, whole: print() from two threads can interleave its parts."""
    with out_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def on_publish(client, userdata, mid, reason_code=None, properties=None):
    with lock:
        payload = pending.pop(mid, None)
        if payload is None:
            done.add(mid)
            return
    say("acked " + payload)


if v5:
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    client = mqtt.Client(
        mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5
    )
    connect_props = Properties(PacketTypes.CONNECT)
    connect_props.SessionExpiryInterval = 3600
    connect_args = {"clean_start": False, "properties": connect_props}
else:
    client = mqtt.Client(
        mqtt.CallbackAPIVersion.VERSION2,
        client_id=client_id,
        clean_session=False,
        protocol=mqtt.MQTTv311,
    )
    connect_args = {}
client.max_inflight_messages_set(20)
client.max_queued_messages_set(0)
client.reconnect_delay_set(min_delay=1, max_delay=1)
client.on_publish = on_publish
while True:
    try:
        client.connect(host, port, keepalive=30, **connect_args)
        break
    except OSError:
        time.sleep(0.1)
client.loop_start()
for n in range(1, count + 1):
    payload = f"{client_id}-{n:06d}"
    # Not under the lock: paho calls on_publish with its own lock held.
    info = client.publish(topic, payload, qos=qos)
    with lock:
        early = info.mid in done
        if early:
            done.discard(info.mid)
        else:
            pending[info.mid] = payload
    if early:
        say("acked " + payload)
    # Keep the stream steady: at most 20 in flight, the rest queued in the client.
    if pace and n % 20 == 0:
        time.sleep(pace)
say("queued")
# Not info.is_published(): it raises for a message published while the client was
# disconnected, which paho still sends after the reconnect.
deadline = time.time() + 240
while True:
    with lock:
        waiting = len(pending)
    if waiting == 0:
        break
    if time.time() > deadline:
        say(f"timeout with {waiting} not acknowledged")
        sys.exit(1)
    time.sleep(0.01)
client.disconnect()
client.loop_stop()
say("done")
