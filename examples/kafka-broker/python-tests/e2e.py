#!/usr/bin/env python3
"""End-to-end test of the diskless example broker with real Kafka clients (librdkafka based).

Phase 1 (fresh broker):
  - creates a multi-partition diskless topic;
  - an idempotent confluent-kafka producer (enable.idempotence=true, acks=all) sends N keyed messages
    with headers and explicit timestamps with each codec (none, gzip, snappy, lz4, zstd); every
    delivery report must be a success;
  - kcat consumes each partition from the beginning: every message exactly once, in offset order,
    with the keys, values, headers and timestamps that were sent;
  - a confluent-kafka group consumer with two members reads everything (exactly once, in order per
    partition, same content) and commits; committed offsets equal the end offsets;
  - a client whose client.id carries diskless_rack_id=<rack> sees only leaders of its rack;
  - with --shard-map FILE (a broker run with --shards N): a client without a rack sees, for each
    coordinator shard, one leader for all the shard's partitions (its produce gateway), and
    different shards on different brokers;
  - ListOffsets by timestamp answers the exact record, as Kafka: several messages with explicit,
    out-of-order timestamps in one compressed batch; consumer offsets_for_times and the admin
    client's list_offsets (for_timestamp, max_timestamp) get the first record whose timestamp is at
    or after the target (with its timestamp), not the batch's base offset.
Phase 2 (after the caller restarted the broker on the same data directory):
  - kcat reads the same data, the group's committed offsets are still there;
  - DeleteRecords through the admin client moves the log start offset; consuming from the beginning
    starts there.

Usage: e2e.py --bootstrap HOST:PORT[,HOST:PORT...] --state FILE --phase 1|2 [--shard-map FILE]
Exit status 0 on success; a failure prints what differs and exits 1.
"""

import argparse
import json
import shutil
import subprocess
import sys
import time

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec
from harness import Failure, check, logger, client_conf

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
PARTITIONS = 4
PER_CODEC = 200
GROUP = "e2e-group"
TIMEOUT_S = 60


log = logger("e2e")


common = client_conf


# ---------------------------------------------------------------------------------------------
# Phase 1


def create_topic(bootstrap, topic):
    admin = AdminClient(common(bootstrap, "e2e-admin"))
    futures = admin.create_topics(
        [NewTopic(topic, num_partitions=PARTITIONS, replication_factor=-1,
                  config={"retention.ms": "-1"})],
        operation_timeout=30,
    )
    futures[topic].result(timeout=TIMEOUT_S)
    md = admin.list_topics(topic, timeout=TIMEOUT_S)
    t = md.topics[topic]
    check(t.error is None, f"metadata of {topic}: {t.error}")
    check(len(t.partitions) == PARTITIONS, f"{topic} has {len(t.partitions)} partitions")
    leaders = sorted({p.leader for p in t.partitions.values()})
    log(f"created {topic}: {PARTITIONS} partitions, leaders on brokers {leaders}")
    # Creating it again is refused.
    again = admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=-1)])
    try:
        again[topic].result(timeout=TIMEOUT_S)
        raise Failure("creating an existing topic succeeded")
    except KafkaException as e:
        check(e.args[0].name() == "TOPIC_ALREADY_EXISTS", f"unexpected error {e}")


def produce_all(bootstrap, topic, base_ts):
    """Returns {partition: [message dict in offset order]}."""
    sent = {p: [] for p in range(PARTITIONS)}
    for codec in CODECS:
        producer = Producer({
            **common(bootstrap, f"e2e-producer-{codec}"),
            "enable.idempotence": True,
            "acks": "all",
            "compression.type": codec,
            "linger.ms": 20,
            "batch.num.messages": 50,
        })
        errors = []
        delivered = []

        def on_delivery(err, msg, record, errors=errors, delivered=delivered):
            if err is not None:
                errors.append(str(err))
            else:
                ts_type, ts = msg.timestamp()
                check(ts == record["timestamp"],
                      f"delivery report timestamp {ts} != {record['timestamp']}")
                delivered.append((msg.partition(), msg.offset(), record))

        for i in range(PER_CODEC):
            key = f"{codec}-key-{i % 13}"
            # Some values are large and repetitive (so that codecs actually compress), most short.
            value = f"{codec}-value-{i}-" + ("abcdefgh" * 600 if i % 40 == 0 else "x" * (i % 17))
            headers = [("codec", codec), ("seq", str(i)), ("empty", "")]
            record = {
                "key": key,
                "value": value,
                "headers": [[k, v] for k, v in headers],
                "timestamp": base_ts + len(CODECS) * i + CODECS.index(codec),
            }
            producer.produce(topic, key=key.encode(), value=value.encode(),
                             headers=[(k, v.encode()) for k, v in headers],
                             timestamp=record["timestamp"],
                             on_delivery=lambda err, msg, record=record: on_delivery(err, msg, record))
            producer.poll(0)
        remaining = producer.flush(TIMEOUT_S)
        check(remaining == 0, f"{codec}: {remaining} messages not delivered in time")
        check(not errors, f"{codec}: delivery errors: {errors[:5]}")
        check(len(delivered) == PER_CODEC, f"{codec}: {len(delivered)} delivery reports")
        for partition, offset, record in delivered:
            sent[partition].append({"offset": offset, **record})
        log(f"{codec}: {PER_CODEC} messages delivered")
    for p in sent:
        sent[p].sort(key=lambda m: m["offset"])
        offsets = [m["offset"] for m in sent[p]]
        check(offsets == list(range(len(offsets))),
              f"partition {p}: offsets are not 0..{len(offsets) - 1} without gaps: {offsets[:20]}")
    return sent


def kcat_partition(bootstrap, topic, partition):
    out = subprocess.run(
        ["kcat", "-C", "-b", bootstrap, "-t", topic, "-p", str(partition), "-o", "beginning",
         "-e", "-J", "-q", "-X", "broker.address.family=v4"],
        capture_output=True, text=True, timeout=TIMEOUT_S,
    )
    check(out.returncode == 0, f"kcat failed ({out.returncode}): {out.stderr}")
    messages = []
    for line in out.stdout.splitlines():
        line = line.strip()
        if not line:
            continue
        m = json.loads(line)
        headers = m.get("headers") or []
        messages.append({
            "offset": m["offset"],
            "key": m.get("key"),
            "value": m.get("payload"),
            "headers": [[headers[i], headers[i + 1]] for i in range(0, len(headers), 2)],
            "timestamp": m.get("ts"),
        })
    return messages


def compare(where, got, want):
    check(len(got) == len(want), f"{where}: {len(got)} messages, expected {len(want)}")
    for g, w in zip(got, want):
        for field in ("offset", "key", "value", "headers", "timestamp"):
            check(g[field] == w[field],
                  f"{where}: offset {w['offset']}: {field} is {str(g[field])[:80]!r}, "
                  f"expected {str(w[field])[:80]!r}")


def check_with_kcat(bootstrap, topic, expected, start=None):
    for p in range(PARTITIONS):
        want = expected[str(p)]
        if start is not None:
            want = [m for m in want if m["offset"] >= start[str(p)]]
        compare(f"kcat partition {p}", kcat_partition(bootstrap, topic, p), want)
    log("kcat read every partition from the beginning: all messages exactly once, in order")


def group_consume(bootstrap, topic, expected):
    total = sum(len(v) for v in expected.values())
    received = {}
    assignments = {}

    def make(name):
        consumer = None

        def on_assign(c, partitions):
            assignments[name] = [tp.partition for tp in partitions]

        def on_revoke(c, partitions):
            assignments[name] = []
            try:
                c.commit(asynchronous=False)
            except KafkaException:
                pass  # nothing consumed yet

        consumer = Consumer({
            **common(bootstrap, f"e2e-consumer-{name}"),
            "group.id": GROUP,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 10000,
            "heartbeat.interval.ms": 500,
        })
        consumer.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke)
        return consumer

    members = {"a": make("a"), "b": make("b")}
    count = 0
    deadline = time.time() + 2 * TIMEOUT_S
    while count < total:
        check(time.time() < deadline,
              f"group consumers read {count} of {total} messages in time; assignments {assignments}")
        for name, c in members.items():
            msg = c.poll(0.1)
            if msg is None:
                continue
            if msg.error():
                raise Failure(f"consumer {name}: {msg.error()}")
            p = msg.partition()
            ts_type, ts = msg.timestamp()
            received.setdefault(p, []).append({
                "offset": msg.offset(),
                "key": msg.key().decode(),
                "value": msg.value().decode(),
                "headers": [[k, v.decode()] for k, v in (msg.headers() or [])],
                "timestamp": ts,
                "member": name,
            })
            count += 1
    # Nothing more arrives.
    for _ in range(10):
        for name, c in members.items():
            msg = c.poll(0.1)
            check(msg is None or msg.error() is not None,
                  f"consumer {name} got an extra message at offset {msg and msg.offset()}")
    for p in range(PARTITIONS):
        got = received.get(p, [])
        compare(f"group consumer partition {p}", got, expected[str(p)])
    by_member = {n: sum(1 for ms in received.values() for m in ms if m["member"] == n)
                 for n in members}
    log(f"group consumers read {total} messages exactly once (per member: {by_member}; "
        f"assignments {assignments})")
    check(all(assignments.get(n) for n in members),
          f"both members should own partitions at the end: {assignments}")
    for c in members.values():
        c.commit(asynchronous=False)
    check_committed(bootstrap, topic, expected)
    for c in members.values():
        c.close()


def check_committed(bootstrap, topic, expected):
    c = Consumer({**common(bootstrap, "e2e-offsets-reader"), "group.id": GROUP,
                  "enable.auto.commit": False})
    try:
        committed = c.committed([TopicPartition(topic, p) for p in range(PARTITIONS)],
                                timeout=TIMEOUT_S)
    finally:
        c.close()
    for tp in committed:
        want = len(expected[str(tp.partition)])
        check(tp.error is None, f"committed offset of partition {tp.partition}: {tp.error}")
        check(tp.offset == want,
              f"committed offset of partition {tp.partition} is {tp.offset}, expected {want}")
    log(f"group {GROUP} committed offsets equal the end offsets")


def check_rack_leaders(bootstrap, topic):
    for rack in ("rack-1", "rack-2", "rack-3"):
        admin = AdminClient(common(bootstrap, f"e2e-rack diskless_rack_id={rack}"))
        md = admin.list_topics(topic, timeout=TIMEOUT_S)
        brokers = {b.id: b for b in md.brokers.values()}
        leaders = {p.leader for p in md.topics[topic].partitions.values()}
        racks = {getattr(brokers[l], "rack", None) for l in leaders} - {None}
        # Rack of a broker: node id n has rack "rack-n" in the default setup.
        check(leaders == {int(rack.split("-")[1])},
              f"client in {rack} got leaders {leaders} (racks {racks})")
    log("clients with diskless_rack_id=<rack> get leaders of their own rack")


def read_shard_map(path):
    """The broker's partition -> shard map file: {topic id: [shard of partition 0, ...]}."""
    with open(path) as f:
        lines = f.read().splitlines()
    check(lines and lines[0] == "diskless-shard-map v1", f"{path}: unknown header")
    out = {}
    for line in lines[1:]:
        if line.strip():
            topic_id, shards = line.split(" ", 1)
            out[topic_id] = [int(s) for s in shards.split(",")]
    return out


def check_shard_leaders(bootstrap, topic, shard_map):
    """Sharded broker: a rack-less client gets one leader per shard (the shard's gateway)."""
    placements = read_shard_map(shard_map)
    check(len(placements) == 1, f"expected the placement of one topic, got {placements}")
    shards = next(iter(placements.values()))
    check(len(shards) == PARTITIONS, f"placement {shards} of {PARTITIONS} partitions")
    check(len(set(shards)) > 1, f"all partitions on one shard: {shards}")
    admin = AdminClient(common(bootstrap, "e2e-no-rack"))
    md = admin.list_topics(topic, timeout=TIMEOUT_S)
    leaders = {p: m.leader for p, m in md.topics[topic].partitions.items()}
    by_shard = {}
    for p, shard in enumerate(shards):
        by_shard.setdefault(shard, set()).add(leaders[p])
    check(all(len(l) == 1 for l in by_shard.values()),
          f"partitions of one shard have several leaders: {by_shard}")
    gateways = [next(iter(l)) for l in by_shard.values()]
    check(len(set(gateways)) == len(gateways),
          f"different shards share a gateway broker: {by_shard}")
    log(f"sharded: each shard's partitions are led by its gateway broker {by_shard}")


def check_topic_configs(bootstrap):
    """max.message.bytes, message.timestamp.type=LogAppendTime and retention.ms are honoured."""
    admin = AdminClient(common(bootstrap, "e2e-admin"))
    stamp = int(time.time() * 1000)
    small, lat, short = (f"e2e-small-{stamp}", f"e2e-logappend-{stamp}", f"e2e-retention-{stamp}")
    futures = admin.create_topics([
        NewTopic(small, num_partitions=1, replication_factor=-1,
                 config={"max.message.bytes": "2000"}),
        NewTopic(lat, num_partitions=1, replication_factor=-1,
                 config={"message.timestamp.type": "LogAppendTime"}),
        NewTopic(short, num_partitions=1, replication_factor=-1,
                 config={"retention.ms": "1000"}),
    ])
    for f in futures.values():
        f.result(timeout=TIMEOUT_S)
    # An invalid config value is refused.
    bad = admin.create_topics([NewTopic(f"e2e-bad-{stamp}", num_partitions=1,
                                        replication_factor=-1, config={"cleanup.policy": "shred"})])
    try:
        bad[f"e2e-bad-{stamp}"].result(timeout=TIMEOUT_S)
        raise Failure("a topic with cleanup.policy=shred was created")
    except KafkaException as e:
        check(e.args[0].name() == "INVALID_CONFIG", f"unexpected error {e}")

    outcomes = []
    producer = Producer({**common(bootstrap, "e2e-config-producer"), "acks": "all",
                         "linger.ms": 0})
    producer.produce(small, value=b"s" * 100,
                     on_delivery=lambda err, msg: outcomes.append(("small-ok", err)))
    producer.flush(TIMEOUT_S)
    producer.produce(small, value=b"b" * 5000,
                     on_delivery=lambda err, msg: outcomes.append(("small-big", err)))
    old = int(time.time() * 1000) - 3_600_000
    before = int(time.time() * 1000)
    for i in range(5):
        producer.produce(lat, value=f"lat-{i}".encode(), timestamp=old + i,
                         on_delivery=lambda err, msg: outcomes.append(("lat", err)))
        producer.produce(short, value=f"short-{i}".encode(),
                         on_delivery=lambda err, msg: outcomes.append(("short", err)))
    check(producer.flush(TIMEOUT_S) == 0, "config producer: not everything delivered")
    after = int(time.time() * 1000)
    errors = {name: str(err) for name, err in outcomes if err is not None}
    check(set(errors) == {"small-big"}, f"delivery outcomes: {errors}")
    check("MSG_SIZE_TOO_LARGE" in errors["small-big"] or "too large" in errors["small-big"].lower(),
          f"a 5000-byte message to max.message.bytes=2000 failed with {errors['small-big']}")

    c = Consumer({**common(bootstrap, "e2e-config-consumer"), "group.id": f"e2e-cfg-{stamp}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    try:
        c.assign([TopicPartition(lat, 0, 0)])
        got = []
        deadline = time.time() + TIMEOUT_S
        while len(got) < 5 and time.time() < deadline:
            msg = c.poll(0.2)
            if msg is not None and not msg.error():
                got.append(msg.timestamp())
        check(len(got) == 5, f"LogAppendTime topic: read {len(got)} of 5 messages")
        for ts_type, ts in got:
            check(ts_type == 2, f"LogAppendTime topic: timestamp type {ts_type}")
            check(before - 1000 <= ts <= after + 1000,
                  f"LogAppendTime topic: timestamp {ts} is not the append time "
                  f"({before}..{after}), producer sent {old}")
        log("max.message.bytes and message.timestamp.type=LogAppendTime are honoured")

        # retention.ms=1000: the broker's retention pass (--retention-check-ms) deletes the records.
        deadline = time.time() + TIMEOUT_S
        low = high = None
        while time.time() < deadline:
            low, high = c.get_watermark_offsets(TopicPartition(short, 0), timeout=TIMEOUT_S)
            if high == 5 and low == 5:
                break
            time.sleep(0.5)
        check((low, high) == (5, 5),
              f"retention.ms=1000: log start {low}, high watermark {high}, expected 5, 5")
        log("retention.ms is honoured: expired records are deleted")
    finally:
        c.close()


def check_offsets_for_times(bootstrap):
    """ListOffsets by timestamp inside a multi-record batch answers the record (Kafka's answer)."""
    admin = AdminClient(common(bootstrap, "e2e-admin"))
    topic = f"e2e-times-{int(time.time() * 1000)}"
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=-1)])[topic].result(
        timeout=TIMEOUT_S)
    base = int(time.time() * 1000) - 30_000
    # Out of order, with a tie on the max: the first record holding it answers MAX_TIMESTAMP.
    deltas = [10, 50, 20, 70, 40, 30, 70, 60]
    delivered = []
    # A long linger and one flush: every message goes in one (gzip) batch.
    producer = Producer({**common(bootstrap, "e2e-times-producer"), "acks": "all",
                         "linger.ms": 5000, "batch.num.messages": 1000,
                         "compression.type": "gzip"})
    for i, d in enumerate(deltas):
        producer.produce(topic, value=f"t-{i}".encode(), timestamp=base + d,
                         on_delivery=lambda err, msg: delivered.append((err, msg.offset())))
    check(producer.flush(TIMEOUT_S) == 0, "offsets_for_times producer: not everything delivered")
    check(all(err is None for err, _ in delivered), f"delivery errors: {delivered}")
    check(sorted(o for _, o in delivered) == list(range(len(deltas))),
          f"offsets {sorted(o for _, o in delivered)}")
    records = [(o, base + d) for o, d in enumerate(deltas)]

    def expected(target):
        return next(((o, ts) for o, ts in records if ts >= target), (-1, -1))

    targets = sorted({base + d + k for d in deltas for k in (-1, 0, 1)} | {base - 1_000})
    c = Consumer({**common(bootstrap, "e2e-times-consumer"), "group.id": f"{topic}-g"})
    try:
        for t in targets:
            got = c.offsets_for_times([TopicPartition(topic, 0, t)], timeout=TIMEOUT_S)
            check(got[0].error is None, f"offsets_for_times({t}): {got[0].error}")
            want = expected(t)[0]
            check(got[0].offset == want,
                  f"offsets_for_times(base+{t - base}) = {got[0].offset}, expected {want} "
                  f"(records {[(o, ts - base) for o, ts in records]})")
    finally:
        c.close()
    tp = TopicPartition(topic, 0)
    for t in targets:
        info = admin.list_offsets({tp: OffsetSpec.for_timestamp(t)})[tp].result(timeout=TIMEOUT_S)
        check((info.offset, info.timestamp) == expected(t),
              f"list_offsets(for_timestamp base+{t - base}) = ({info.offset}, {info.timestamp}), "
              f"expected {expected(t)}")
    info = admin.list_offsets({tp: OffsetSpec.max_timestamp()})[tp].result(timeout=TIMEOUT_S)
    check((info.offset, info.timestamp) == (3, base + 70),
          f"list_offsets(max_timestamp) = ({info.offset}, {info.timestamp}), "
          f"expected (3, {base + 70})")
    log("ListOffsets by timestamp inside a batch answers the exact record "
        "(offsets_for_times, list_offsets for_timestamp and max_timestamp)")


def phase1(args):
    topic = f"e2e-diskless-{int(time.time() * 1000)}"
    create_topic(args.bootstrap, topic)
    base_ts = int(time.time() * 1000) - 60_000
    sent = produce_all(args.bootstrap, topic, base_ts)
    expected = {str(p): v for p, v in sent.items()}
    with open(args.state, "w") as f:
        json.dump({"topic": topic, "expected": expected}, f)
    check_with_kcat(args.bootstrap, topic, expected)
    group_consume(args.bootstrap, topic, expected)
    check_rack_leaders(args.bootstrap, topic)
    if args.shard_map:
        check_shard_leaders(args.bootstrap, topic, args.shard_map)
    check_topic_configs(args.bootstrap)
    check_offsets_for_times(args.bootstrap)


# ---------------------------------------------------------------------------------------------
# Phase 2


def phase2(args):
    with open(args.state) as f:
        state = json.load(f)
    topic, expected = state["topic"], state["expected"]
    check_with_kcat(args.bootstrap, topic, expected)
    check_committed(args.bootstrap, topic, expected)

    admin = AdminClient(common(args.bootstrap, "e2e-admin"))
    cut = {str(p): len(expected[str(p)]) // 2 + p for p in range(PARTITIONS)}
    futures = admin.delete_records([TopicPartition(topic, p, cut[str(p)]) for p in range(PARTITIONS)])
    for tp, fut in futures.items():
        result = fut.result(timeout=TIMEOUT_S)
        check(result.low_watermark == cut[str(tp.partition)],
              f"DeleteRecords on partition {tp.partition}: low watermark {result.low_watermark}, "
              f"expected {cut[str(tp.partition)]}")
    c = Consumer({**common(args.bootstrap, "e2e-watermarks"), "group.id": "e2e-watermarks"})
    try:
        for p in range(PARTITIONS):
            low, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=TIMEOUT_S)
            check(low == cut[str(p)], f"partition {p}: log start {low}, expected {cut[str(p)]}")
            check(high == len(expected[str(p)]), f"partition {p}: high watermark {high}")
    finally:
        c.close()
    log(f"DeleteRecords moved the log start offsets to {cut}")
    check_with_kcat(args.bootstrap, topic, expected, start=cut)
    log("consuming from the beginning starts at the new log start offsets")


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--state", required=True, help="file passing what was sent to phase 2")
    parser.add_argument("--phase", type=int, choices=(1, 2), required=True)
    parser.add_argument("--shard-map", help="the broker's shard map file (broker run with --shards)")
    args = parser.parse_args()
    check(shutil.which("kcat") is not None, "kcat is not installed")
    try:
        if args.phase == 1:
            phase1(args)
        else:
            phase2(args)
    except (Failure, KafkaException, subprocess.TimeoutExpired) as e:
        print(f"[e2e] FAILED (phase {args.phase}): {e}", file=sys.stderr, flush=True)
        return 1
    log(f"phase {args.phase} passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
