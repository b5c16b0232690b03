#!/usr/bin/env python3
"""ListOffsets, DeleteRecords and DescribeCluster as confluent-kafka's AdminClient uses them, and a
consumer, against the example broker (run by ../tests/fetch_sessions.rs on a fresh broker
with a 2-partition topic "sessions"). Every answer is checked against what a Kafka broker gives.

  - describe_cluster(include_authorized_operations=True): the brokers, controller 1, the cluster
    id, and every CLUSTER operation (an authorizer-less Kafka allows them all);
  - list_offsets with OffsetSpec earliest / latest / max_timestamp / for_timestamp: offsets,
    record timestamps and leader epochs (0, the epoch Metadata announces, for a found offset);
    a timestamp after every record gives offset -1; a partition that does not exist fails;
  - delete_records: the low watermark moves (to an offset, then to the high watermark with
    OFFSET_END), list_offsets earliest follows; an offset past the high watermark is
    OFFSET_OUT_OF_RANGE;
  - a consumer (assign, from the beginning) reads what was produced, and its watermarks agree;
  - when kafka-python is installed (its consumer keeps KIP-227 fetch sessions; librdkafka sends
    sessionless fetches): a kafka-python consumer reads both partitions while more records arrive,
    over full and incremental fetches, with no session error.

Usage: admin_offsets.py --bootstrap HOST:PORT[,...]   (exit 0 on success)
"""

import argparse
import os
import sys
import time

from confluent_kafka import (Consumer, KafkaError, KafkaException, Producer, TopicPartition,
                             OFFSET_BEGINNING, OFFSET_END)
from confluent_kafka.admin import AclOperation, AdminClient, OffsetSpec
from harness import Failure, check, logger, client_conf

TOPIC = "sessions"
TIMEOUT_S = 30


log = logger("admin_offsets")


conf = client_conf


def produce(bootstrap, partition, values, timestamps):
    producer = Producer({**conf(bootstrap, "admin-offsets-producer"), "enable.idempotence": True,
                         "linger.ms": 50})
    errors = []

    def report(err, _msg):
        if err is not None:
            errors.append(err)

    for value, ts in zip(values, timestamps):
        producer.produce(TOPIC, value=value, partition=partition, timestamp=ts,
                         on_delivery=report)
    check(producer.flush(TIMEOUT_S) == 0, "produce did not finish")
    check(not errors, f"delivery errors: {errors}")


def describe_cluster(admin, ports):
    result = admin.describe_cluster(include_authorized_operations=True,
                                    request_timeout=TIMEOUT_S).result(timeout=TIMEOUT_S)
    nodes = sorted((n.id, n.host, n.port) for n in result.nodes)
    check(nodes == [(i + 1, "127.0.0.1", p) for i, p in enumerate(ports)],
          f"describe_cluster nodes {nodes}")
    check(result.controller is not None and result.controller.id == 1,
          f"controller {result.controller}")
    check(result.cluster_id == "diskless-example", f"cluster id {result.cluster_id}")
    # librdkafka's describe_cluster reads these from Metadata (v8-10,
    # include_cluster_authorized_operations), not from DescribeCluster (API 60, checked by
    # fetch_sessions.rs with hand-built requests).
    want = {AclOperation.CREATE, AclOperation.ALTER, AclOperation.DESCRIBE,
            AclOperation.CLUSTER_ACTION, AclOperation.DESCRIBE_CONFIGS,
            AclOperation.ALTER_CONFIGS, AclOperation.IDEMPOTENT_WRITE}
    check(result.authorized_operations is not None, "cluster authorized operations answered")
    ops = set(result.authorized_operations or [])
    check(ops == want, f"cluster authorized operations {sorted(o.name for o in ops)}")
    # Without asking: no operations.
    plain = admin.describe_cluster(request_timeout=TIMEOUT_S).result(timeout=TIMEOUT_S)
    check(not plain.authorized_operations, f"not asked, got {plain.authorized_operations}")
    log("describe_cluster ok:", nodes)


def offsets(admin, spec, partition=0):
    tp = TopicPartition(TOPIC, partition)
    return admin.list_offsets({tp: spec}, request_timeout=TIMEOUT_S)[tp].result(timeout=TIMEOUT_S)


def list_offsets(admin, base, timestamps):
    n = len(timestamps)
    info = offsets(admin, OffsetSpec.earliest())
    check((info.offset, info.leader_epoch) == (0, 0), f"earliest {info}")
    info = offsets(admin, OffsetSpec.latest())
    check((info.offset, info.leader_epoch) == (n, 0), f"latest {info}")
    top = max(timestamps)
    at = timestamps.index(top)
    info = offsets(admin, OffsetSpec.max_timestamp())
    check((info.offset, info.timestamp, info.leader_epoch) == (at, top, 0),
          f"max_timestamp {info}, want offset {at} timestamp {top}")
    for target in sorted(set(timestamps)):
        want = next(i for i, t in enumerate(timestamps) if t >= target)
        info = offsets(admin, OffsetSpec.for_timestamp(target))
        check((info.offset, info.timestamp) == (want, timestamps[want]),
              f"for_timestamp(base+{target - base}) {info}, want offset {want}")
    info = offsets(admin, OffsetSpec.for_timestamp(top + 1))
    check(info.offset == -1, f"for_timestamp after every record {info}")
    # The empty partition: earliest = latest = 0.
    info = offsets(admin, OffsetSpec.latest(), partition=1)
    check(info.offset == 0, f"latest of the empty partition {info}")
    # A partition that does not exist: librdkafka finds no leader for it in Metadata and fails
    # before asking (_NOENT), as against Kafka; the broker's own answer is checked by
    # fetch_sessions.rs.
    try:
        info = offsets(admin, OffsetSpec.latest(), partition=7)
        raise Failure(f"list_offsets of partition 7 answered {info}")
    except KafkaException as e:
        code = e.args[0].code()
        check(code in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION,
                      KafkaError._NOENT),
              f"list_offsets of partition 7: {e}")
    log("list_offsets ok (earliest, latest, max_timestamp, for_timestamp, unknown partition)")


def delete_records(admin, n):
    def delete(offset):
        tp = TopicPartition(TOPIC, 0, offset)
        return admin.delete_records([tp], request_timeout=TIMEOUT_S)[tp].result(timeout=TIMEOUT_S)

    result = delete(4)
    check(result.low_watermark == 4, f"delete_records(4) low watermark {result.low_watermark}")
    check(offsets(admin, OffsetSpec.earliest()).offset == 4, "earliest after delete_records(4)")
    # Kafka: deleting below the log start leaves it where it is.
    result = delete(2)
    check(result.low_watermark == 4, f"delete_records(2) low watermark {result.low_watermark}")
    try:
        result = delete(n + 5)
        raise Failure(f"delete_records past the high watermark answered {result}")
    except KafkaException as e:
        check(e.args[0].code() == KafkaError.OFFSET_OUT_OF_RANGE, f"past the high watermark: {e}")
    result = delete(OFFSET_END)
    check(result.low_watermark == n, f"delete_records(OFFSET_END) low watermark "
          f"{result.low_watermark}, want the high watermark {n}")
    info = offsets(admin, OffsetSpec.earliest())
    check(info.offset == n, f"earliest after deleting everything {info}")
    log("delete_records ok")


def consume(bootstrap, values):
    consumer = Consumer({**conf(bootstrap, "admin-offsets-consumer"), "group.id": "admin-offsets",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 200})
    consumer.assign([TopicPartition(TOPIC, 1, OFFSET_BEGINNING)])
    got = []
    deadline = time.time() + TIMEOUT_S
    while len(got) < len(values) and time.time() < deadline:
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        check(msg.error() is None, f"consumer error {msg.error()}")
        got.append((msg.offset(), msg.value()))
    low, high = consumer.get_watermark_offsets(TopicPartition(TOPIC, 1), timeout=TIMEOUT_S)
    consumer.close()
    check(got == list(enumerate(values)), f"consumed {got}")
    check((low, high) == (0, len(values)), f"watermarks {(low, high)}")
    log(f"consumer read {len(got)} records")


def kafka_python_consumer(bootstrap):
    """A kafka-python consumer over both partitions while records arrive: it opens a fetch session
    per broker and continues it with incremental fetches (its FetchSessionHandler logs each
    response kind; any session error or invalid response fails)."""
    try:
        import kafka
    except ImportError:
        # CI installs it and requires it (DISKLESS_REQUIRE_KAFKA_CLIENTS=1), as for the other clients.
        check(os.environ.get("DISKLESS_REQUIRE_KAFKA_CLIENTS") != "1",
              "DISKLESS_REQUIRE_KAFKA_CLIENTS=1 but kafka-python is not installed")
        log("skipped the kafka-python consumer: kafka-python is not installed "
            "(pip install kafka-python)")
        return
    import logging

    class Collect(logging.Handler):
        def __init__(self):
            super().__init__(logging.DEBUG)
            self.messages = []

        def emit(self, record):
            self.messages.append(record.getMessage())

    collect = Collect()
    fetcher_log = logging.getLogger("kafka.consumer.fetcher")
    fetcher_log.setLevel(logging.DEBUG)
    fetcher_log.addHandler(collect)
    consumer = kafka.KafkaConsumer(bootstrap_servers=bootstrap.split(","),
                                   client_id="kafka-python-sessions", enable_auto_commit=False,
                                   fetch_max_wait_ms=100)
    tps = [kafka.TopicPartition(TOPIC, p) for p in (0, 1)]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    start = {tp: consumer.position(tp) for tp in tps}
    end = dict(consumer.end_offsets(tps))
    base = int(time.time() * 1000)
    got = {tp: [] for tp in tps}
    rounds = 0
    deadline = time.time() + TIMEOUT_S
    extra = 0
    while time.time() < deadline:
        for tp, records in consumer.poll(timeout_ms=200).items():
            got[tp].extend(r.offset for r in records)
        rounds += 1
        # New records now and then, in one partition at a time: an incremental response carries
        # only that one.
        if rounds % 5 == 0 and extra < 6:
            partition = extra % 2
            produce(bootstrap, partition, [f"k{extra}".encode()], [base + extra])
            end[tps[partition]] += 1
            extra += 1
        if extra == 6 and all(len(got[tp]) == end[tp] - start[tp] for tp in tps):
            break
    consumer.close()
    fetcher_log.removeHandler(collect)
    for tp in tps:
        check(got[tp] == list(range(start[tp], end[tp])),
              f"kafka-python read {tp.partition}: {got[tp]}, want {start[tp]}..{end[tp]}")
    messages = collect.messages
    bad = [m for m in messages if "unable to process" in m or "invalid" in m]
    check(not bad, f"fetch session errors: {bad[:5]}")
    opened = [m for m in messages if "created a new incremental fetch session" in m]
    continued = [m for m in messages if "sent an incremental fetch response for session" in m]
    check(opened and continued,
          f"no fetch session kept (opened {len(opened)}, continued {len(continued)})")
    log(f"kafka-python consumer ok: {len(opened)} sessions opened, {len(continued)} incremental "
        f"responses, {sum(len(v) for v in got.values())} records")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    args = parser.parse_args()
    ports = [int(a.rsplit(":", 1)[1]) for a in args.bootstrap.split(",")]
    admin = AdminClient(conf(args.bootstrap, "admin-offsets"))
    try:
        describe_cluster(admin, ports)
        base = int(time.time() * 1000) - 60_000
        # Out of order, the largest in the middle, two equal: Kafka answers records, not batches.
        deltas = [5, 1, 9, 3, 30, 7, 7, 12, 2, 20]
        timestamps = [base + d for d in deltas]
        produce(args.bootstrap, 0, [f"v{i}".encode() for i in range(len(deltas))], timestamps)
        list_offsets(admin, base, timestamps)
        delete_records(admin, len(deltas))
        values = [f"c{i}".encode() for i in range(25)]
        produce(args.bootstrap, 1, values, [base + i for i in range(len(values))])
        consume(args.bootstrap, values)
        kafka_python_consumer(args.bootstrap)
    except Failure as e:
        print(f"FAILED: {e}", flush=True)
        return 1
    print("OK", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
