#!/usr/bin/env python3
"""Real clients across the tier boundary of a diskless topic (issue 15: tiered segments).

The broker runs with a fast tiering worker (`--tiering-interval-ms 200 --tiering-min-age-ms 0`);
the topic has `segment.ms=2000`, so its batches are consolidated into Kafka log segments about two
seconds after their commit.

Phase 1 (fresh broker):
  - creates the topic (2 partitions, segment.ms=2000, no time retention);
  - a confluent-kafka producer sends N messages per partition with explicit timestamps;
  - waits until ListOffsets LATEST_TIERED (-5, request v9: librdkafka's OffsetSpec has no such
    value, so this script sends the request itself) reaches N/2 in every partition, and checks
    EARLIEST_LOCAL (-4, v8) is above it;
  - kcat produces N more messages per partition (into the WAL tier);
  - kcat and a confluent-kafka consumer read every partition from the beginning: every message
    exactly once, in order, across the boundary;
  - offsets_for_times and the admin client's list_offsets find a record inside a tiered segment
    by its timestamp.
Phase 2 (after the caller restarted the broker, with --local-cache-dir): the same reads.

Usage: tiering.py --bootstrap HOST:PORT[,HOST:PORT...] --phase 1|2
Exit status 0 on success; a failure prints what differs and exits 1.
"""

import argparse
import json
import socket
import struct
import subprocess
import sys
import time

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec
from harness import Failure, check, logger, client_conf

TOPIC = "tiering-clients"
PARTITIONS = 2
PER_PHASE = 300
BASE_TS = 1_700_000_000_000
TIMEOUT_S = 60
# How long the worker may take to tier half of the data (a bound on a hang, not a timing check).
TIER_WAIT_S = 120
LATEST_TIERED = -5
EARLIEST_LOCAL = -4

log = logger("tiering")


def value(partition, offset):
    return f"p{partition}-record-{offset}"


# ---------------------------------------------------------------------------------------------
# ListOffsets by hand (v8/v9 are flexible versions: compact strings and arrays, tagged fields)


def uvarint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def read_uvarint(buf, pos):
    shift = 0
    n = 0
    while True:
        b = buf[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            return n, pos
        shift += 7


def compact_string(s):
    b = s.encode()
    return uvarint(len(b) + 1) + b


def list_offsets_raw(bootstrap, version, timestamp, correlation=1):
    """ListOffsets of every partition of TOPIC at `timestamp`: {partition: (error, offset)}."""
    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    client_id = b"tiering-py"
    header = struct.pack(">hhih", 2, version, correlation, len(client_id)) + client_id + b"\x00"
    body = struct.pack(">ib", -1, 0)  # replica_id, isolation_level
    body += uvarint(2) + compact_string(TOPIC) + uvarint(PARTITIONS + 1)
    for p in range(PARTITIONS):
        body += struct.pack(">iiq", p, -1, timestamp) + b"\x00"
    body += b"\x00" + b"\x00"  # the topic's tagged fields, the request's
    frame = header + body
    with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as s:
        s.sendall(struct.pack(">i", len(frame)) + frame)
        size = b""
        while len(size) < 4:
            chunk = s.recv(4 - len(size))
            check(chunk, "connection closed")
            size += chunk
        (n,) = struct.unpack(">i", size)
        buf = b""
        while len(buf) < n:
            chunk = s.recv(n - len(buf))
            check(chunk, "connection closed")
            buf += chunk
    (cid,) = struct.unpack_from(">i", buf, 0)
    check(cid == correlation, f"correlation id {cid}")
    pos = 4
    _, pos = read_uvarint(buf, pos)  # response header tagged fields (none)
    pos += 4  # throttle_time_ms
    topics, pos = read_uvarint(buf, pos)
    out = {}
    for _ in range(topics - 1):
        name_len, pos = read_uvarint(buf, pos)
        pos += name_len - 1
        parts, pos = read_uvarint(buf, pos)
        for _ in range(parts - 1):
            p, error, _ts, offset, _epoch = struct.unpack_from(">ihqqi", buf, pos)
            pos += 26
            _, pos = read_uvarint(buf, pos)
            out[p] = (error, offset)
        _, pos = read_uvarint(buf, pos)
    return out


def wait_tiered(bootstrap, at_least):
    deadline = time.time() + TIER_WAIT_S
    while True:
        answer = list_offsets_raw(bootstrap, 9, LATEST_TIERED)
        check(all(e == 0 for e, _ in answer.values()), f"LATEST_TIERED failed: {answer}")
        tiered = {p: o for p, (_, o) in answer.items()}
        if all(o >= at_least for o in tiered.values()):
            return tiered
        check(time.time() < deadline, f"not tiered to {at_least} in time: {tiered}")
        time.sleep(0.2)


# ---------------------------------------------------------------------------------------------
# Phases


def create_topic(bootstrap):
    admin = AdminClient(client_conf(bootstrap, "tiering-admin"))
    futures = admin.create_topics(
        [NewTopic(TOPIC, num_partitions=PARTITIONS, replication_factor=-1,
                  config={"segment.ms": "2000", "retention.ms": "-1"})],
        operation_timeout=30,
    )
    futures[TOPIC].result(timeout=TIMEOUT_S)
    deadline = time.time() + TIMEOUT_S
    while True:
        md = admin.list_topics(TOPIC, timeout=TIMEOUT_S)
        t = md.topics.get(TOPIC)
        if t is not None and t.error is None and len(t.partitions) == PARTITIONS:
            break
        check(time.time() < deadline, f"{TOPIC} not in Metadata")
        time.sleep(0.2)
    log(f"created {TOPIC}: segment.ms=2000")


def produce_confluent(bootstrap):
    producer = Producer({**client_conf(bootstrap, "tiering-producer"), "enable.idempotence": True,
                         "acks": "all", "linger.ms": 5, "batch.num.messages": 20})
    errors = []

    def report(err, msg):
        if err is not None:
            errors.append(str(err))

    for p in range(PARTITIONS):
        for o in range(PER_PHASE):
            producer.produce(TOPIC, value=value(p, o).encode(), partition=p,
                             timestamp=BASE_TS + o, on_delivery=report)
            producer.poll(0)
    check(producer.flush(TIMEOUT_S) == 0, "not every delivery report arrived")
    check(not errors, f"delivery errors: {errors[:5]}")
    log(f"confluent-kafka produced {PER_PHASE} messages per partition")


def produce_kcat(bootstrap):
    for p in range(PARTITIONS):
        lines = "".join(value(p, o) + "\n" for o in range(PER_PHASE, 2 * PER_PHASE))
        out = subprocess.run(
            ["kcat", "-P", "-b", bootstrap, "-t", TOPIC, "-p", str(p),
             "-X", "broker.address.family=v4", "-X", "acks=all"],
            input=lines, capture_output=True, text=True, timeout=TIMEOUT_S,
        )
        check(out.returncode == 0, f"kcat -P failed ({out.returncode}): {out.stderr}")
    log(f"kcat produced {PER_PHASE} more messages per partition")


def expected(partition):
    return [(o, value(partition, o)) for o in range(2 * PER_PHASE)]


def read_kcat(bootstrap, partition):
    out = subprocess.run(
        ["kcat", "-C", "-b", bootstrap, "-t", TOPIC, "-p", str(partition), "-o", "beginning",
         "-e", "-J", "-q", "-X", "broker.address.family=v4"],
        capture_output=True, text=True, timeout=TIMEOUT_S,
    )
    check(out.returncode == 0, f"kcat -C failed ({out.returncode}): {out.stderr}")
    got = []
    for line in out.stdout.splitlines():
        if line.strip():
            m = json.loads(line)
            got.append((m["offset"], m["payload"]))
    return got


def read_confluent(bootstrap, partition):
    consumer = Consumer({**client_conf(bootstrap, "tiering-consumer"),
                         "group.id": f"tiering-{partition}-{time.time()}",
                         "enable.auto.commit": False, "message.max.bytes": 4096, "fetch.max.bytes": 4096,
                         "max.partition.fetch.bytes": 2048})
    consumer.assign([TopicPartition(TOPIC, partition, 0)])
    got = []
    deadline = time.time() + TIMEOUT_S
    while len(got) < 2 * PER_PHASE and time.time() < deadline:
        m = consumer.poll(0.5)
        if m is None:
            continue
        check(m.error() is None, f"consumer error: {m.error()}")
        got.append((m.offset(), m.value().decode()))
    consumer.close()
    return got


def compare(what, got, want):
    if got != want:
        for i, (g, w) in enumerate(zip(got, want)):
            if g != w:
                raise Failure(f"{what}: at {i}: got {g}, expected {w}")
        raise Failure(f"{what}: {len(got)} messages, expected {len(want)}")


def read_everything(bootstrap, tiered):
    for p in range(PARTITIONS):
        compare(f"kcat partition {p}", read_kcat(bootstrap, p), expected(p))
        compare(f"confluent-kafka partition {p}", read_confluent(bootstrap, p), expected(p))
    log(f"kcat and confluent-kafka read every message once, in order, across the boundary "
        f"(latest tiered {tiered})")


def find_by_timestamp(bootstrap, tiered):
    consumer = Consumer({**client_conf(bootstrap, "tiering-times"), "group.id": "tiering-times"})
    admin = AdminClient(client_conf(bootstrap, "tiering-admin"))
    for p in range(PARTITIONS):
        # Tiered, and among the records with explicit timestamps (kcat's carry the time they were
        # produced).
        inside = min(tiered[p], PER_PHASE - 1) // 2 + 1
        found = consumer.offsets_for_times([TopicPartition(TOPIC, p, BASE_TS + inside)],
                                           timeout=TIMEOUT_S)
        check(found[0].error is None and found[0].offset == inside,
              f"offsets_for_times in a tiered segment of partition {p}: {found[0]}, "
              f"expected offset {inside}")
        tp = TopicPartition(TOPIC, p)
        listed = admin.list_offsets({tp: OffsetSpec.for_timestamp(BASE_TS + inside)},
                                    request_timeout=TIMEOUT_S)[tp].result(TIMEOUT_S)
        check(listed.offset == inside and listed.timestamp == BASE_TS + inside,
              f"list_offsets(for_timestamp) partition {p}: {listed.offset} {listed.timestamp}")
        earliest = admin.list_offsets({tp: OffsetSpec.earliest()},
                                      request_timeout=TIMEOUT_S)[tp].result(TIMEOUT_S)
        check(earliest.offset == 0, f"earliest of partition {p}: {earliest.offset}")
    consumer.close()
    log("offsets_for_times and list_offsets found records inside tiered segments")


def check_boundary(bootstrap, tiered):
    # Kafka's versions: EARLIEST_LOCAL from v8, LATEST_TIERED from v9 (UNSUPPORTED_VERSION below).
    local = list_offsets_raw(bootstrap, 8, EARLIEST_LOCAL)
    for p in range(PARTITIONS):
        error, offset = local[p]
        check(error == 0 and offset > tiered[p],
              f"EARLIEST_LOCAL of partition {p}: {local[p]}, latest tiered {tiered[p]}")
    refused = list_offsets_raw(bootstrap, 8, LATEST_TIERED)
    check(all(e == 35 for e, _ in refused.values()), f"LATEST_TIERED at v8: {refused}")


def phase1(bootstrap):
    create_topic(bootstrap)
    before = list_offsets_raw(bootstrap, 9, LATEST_TIERED)
    check(before == {p: (0, -1) for p in range(PARTITIONS)},
          f"LATEST_TIERED of a new topic (nothing tiered: -1): {before}")
    produce_confluent(bootstrap)
    tiered = wait_tiered(bootstrap, PER_PHASE // 2)
    log(f"latest tiered offsets {tiered}")
    check(all(o < PER_PHASE for o in tiered.values()), f"tiered beyond what was produced: {tiered}")
    check_boundary(bootstrap, tiered)
    produce_kcat(bootstrap)
    read_everything(bootstrap, tiered)
    find_by_timestamp(bootstrap, tiered)


def phase2(bootstrap):
    tiered = wait_tiered(bootstrap, PER_PHASE // 2)
    read_everything(bootstrap, tiered)
    find_by_timestamp(bootstrap, tiered)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--phase", type=int, choices=[1, 2], required=True)
    args = parser.parse_args()
    try:
        if args.phase == 1:
            phase1(args.bootstrap)
        else:
            phase2(args.bootstrap)
    except (Failure, KafkaException, subprocess.TimeoutExpired, OSError) as e:
        print(f"[tiering] FAILED (phase {args.phase}): {e}", file=sys.stderr, flush=True)
        return 1
    log(f"phase {args.phase} passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
