#!/usr/bin/env python3
"""Topics and configs of the diskless example broker through confluent-kafka's AdminClient.

--mode plain (a broker without --auto-create-topics):
  - CreateTopics with a manual replica assignment (the partition count comes from it), with topic
    configs Kafka knows (applied ones and ones kept without effect), validate_only (nothing created);
  - refusals as Kafka answers them: an invalid topic name (INVALID_TOPIC_EXCEPTION), an unknown
    config (INVALID_CONFIG), an assignment naming an unknown broker (INVALID_REPLICA_ASSIGNMENT);
  - DescribeConfigs of a topic (every config, values, sources, synonyms) and of a broker;
  - IncrementalAlterConfigs: max.message.bytes lowered, then a produce of a larger message fails with
    MSG_SIZE_TOO_LARGE while a small one succeeds; retention.ms and a kept config change and are
    described; AlterConfigs (legacy) replaces the set configs; message.timestamp.type=LogAppendTime
    applies to the next produce, retention.ms lowered to the next retention pass;
  - topic compression.type (issue 29): a topic created with compression.type=gzip and
    compression.gzip.level=1, then altered to zstd; producers with each codec (and none) write to
    it, and a consumer reads every record back as sent (values, keys, headers, timestamps);
  - cleanup.policy=compact (issue 29): the topic is created and described with its compaction
    configs; a record without a key is refused with INVALID_RECORD, as Kafka refuses it on a
    compacted topic, while keyed records and tombstones are acknowledged and read back;
  - Metadata for an invalid topic name answers INVALID_TOPIC_EXCEPTION, for an unknown topic
    UNKNOWN_TOPIC_OR_PARTITION, and creates nothing.
--mode auto (a broker with --auto-create-topics --num-partitions 2):
  - Metadata for an unknown topic from a producer creates it with 2 partitions; a consumer's
    Metadata (allow.auto.create.topics=false) does not create; invalid names are still refused;
  - producing to an unknown topic creates it and the messages are delivered.

--mode plain also: Metadata reports manual replica assignments (CreateTopics, CreatePartitions)
  as the partitions' replicas and leader; group configs (ConfigResource GROUP) are described, set,
  refused and deleted as Kafka 4.0 does.
--mode keep / kept (before and after a broker restart on the same data directory): kept topic
  configs, manual assignments and group configs survive the restart.

Usage: admin.py --bootstrap HOST:PORT[,...] --mode plain|auto|keep|kept
Exit status 0 on success; a failure prints what differs and exits 1.
"""

import argparse
import sys
import time
import uuid

from confluent_kafka import (TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME, Consumer, KafkaError,
                            KafkaException, Producer, TopicPartition)
from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource,
                                   ConfigSource, NewTopic, OffsetSpec, ResourceType)
from harness import Failure, check, logger

TIMEOUT_S = 30


log = logger("admin")


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def error_name(exc):
    err = exc.args[0] if exc.args else None
    return err.name() if isinstance(err, KafkaError) else repr(exc)


def expect_error(future, name, what):
    try:
        future.result(TIMEOUT_S)
    except KafkaException as e:
        check(error_name(e) == name, f"{what}: expected {name}, got {e}")
        log(f"{what}: {name} ({e.args[0].str()})")
        return
    raise Failure(f"{what}: succeeded, expected {name}")


def topic_metadata(client, topic):
    md = client.list_topics(topic=topic, timeout=TIMEOUT_S)
    return md.topics.get(topic)


def wait_topic(admin, topic, partitions):
    deadline = time.time() + TIMEOUT_S
    while True:
        t = topic_metadata(admin, topic)
        if t is not None and t.error is None and len(t.partitions) == partitions:
            return
        check(time.time() < deadline, f"topic {topic}: not visible with {partitions} partitions: {t}")
        time.sleep(0.2)


def describe_topic(admin, topic):
    res = ConfigResource(ResourceType.TOPIC, topic)
    return admin.describe_configs([res], request_timeout=TIMEOUT_S)[res].result(TIMEOUT_S)


def check_assignment(admin, topic, expected):
    """Metadata reports a manual replica assignment as Kafka does: those replicas (and ISR), the
    first one leading."""
    t = topic_metadata(admin, topic)
    for partition, replicas in expected.items():
        p = t.partitions.get(partition)
        check(p is not None, f"{topic}: partition {partition} missing from Metadata")
        check(list(p.replicas) == replicas and p.leader == replicas[0],
              f"{topic}/{partition}: leader {p.leader} replicas {p.replicas}, assigned {replicas}")


def group_configs(admin):
    """Group configs (Kafka 4.0's GroupConfig, ConfigResource type GROUP): described with defaults
    and broker synonyms for any group name, set and deleted with IncrementalAlterConfigs, checked
    against the broker's bounds, unknown names refused."""
    group = unique("cfg-group")

    def describe():
        res = ConfigResource(ResourceType.GROUP, group)
        return admin.describe_configs([res], request_timeout=TIMEOUT_S)[res].result(TIMEOUT_S)

    described = describe()
    for name, value in [("consumer.session.timeout.ms", "45000"),
                        ("consumer.heartbeat.interval.ms", "5000"),
                        ("share.record.lock.duration.ms", "30000"),
                        ("share.auto.offset.reset", "latest")]:
        e = described.get(name)
        check(e is not None and e.value == value and e.source == ConfigSource.DEFAULT_CONFIG.value,
              f"group config {name}: {e}, expected the default {value}")
    synonyms = [(s.name, s.value) for s in described["consumer.session.timeout.ms"].synonyms.values()]
    check(("group.consumer.session.timeout.ms", "45000") in synonyms,
          f"consumer.session.timeout.ms synonyms {synonyms}")

    def alter(*entries, validate_only=False):
        res = ConfigResource(ResourceType.GROUP, group, incremental_configs=list(entries))
        return admin.incremental_alter_configs([res], validate_only=validate_only,
                                               request_timeout=TIMEOUT_S)[res]

    alter(ConfigEntry("consumer.session.timeout.ms", "50000",
                      incremental_operation=AlterConfigOpType.SET)).result(TIMEOUT_S)
    e = describe()["consumer.session.timeout.ms"]
    check(e.value == "50000" and e.source == ConfigSource.GROUP_CONFIG.value,
          f"after SET: consumer.session.timeout.ms {e.value} source {e.source}")
    for entry, what in [
            (ConfigEntry("consumer.session.timeout.ms", "70000",
                         incremental_operation=AlterConfigOpType.SET), "above the broker's maximum"),
            (ConfigEntry("consumer.heartbeat.interval.ms", "abc",
                         incremental_operation=AlterConfigOpType.SET), "not a number"),
            (ConfigEntry("no.such.group.config", "1",
                         incremental_operation=AlterConfigOpType.SET), "unknown name"),
            (ConfigEntry("share.auto.offset.reset", "none",
                         incremental_operation=AlterConfigOpType.SET), "not latest/earliest")]:
        expect_error(alter(entry), "INVALID_CONFIG", f"group config {entry.name}: {what}")
    check(describe()["consumer.session.timeout.ms"].value == "50000",
          "a refused alteration changed the group's configs")
    alter(ConfigEntry("consumer.session.timeout.ms", None,
                      incremental_operation=AlterConfigOpType.DELETE)).result(TIMEOUT_S)
    e = describe()["consumer.session.timeout.ms"]
    check(e.value == "45000" and e.source == ConfigSource.DEFAULT_CONFIG.value,
          f"after DELETE: consumer.session.timeout.ms {e.value} source {e.source}")
    log(f"{group}: group configs described, set, refused and deleted as Kafka's")
    return group


def create_and_refuse(admin, bootstrap):
    # A manual replica assignment: three partitions, two replicas each.
    assigned = unique("adm-assigned")
    admin.create_topics([NewTopic(assigned, num_partitions=3, replica_assignment=[[1, 2], [2, 3], [3, 1]])],
                        request_timeout=TIMEOUT_S)[assigned].result(TIMEOUT_S)
    wait_topic(admin, assigned, 3)
    check_assignment(admin, assigned, {0: [1, 2], 1: [2, 3], 2: [3, 1]})
    log(f"{assigned}: created from a replica assignment with 3 partitions, Metadata reports it")

    # Every config Kafka knows is accepted; the ones acting on a diskless topic are applied.
    configured = unique("adm-configured")
    configs = {"retention.ms": "3600000", "max.message.bytes": "100000",
               "segment.bytes": "1048576", "delete.retention.ms": "1000",
               "min.insync.replicas": "2", "cleanup.policy": "delete",
               "compression.type": "producer", "message.timestamp.type": "CreateTime"}
    admin.create_topics([NewTopic(configured, num_partitions=2, replication_factor=-1,
                                  config=configs)],
                        request_timeout=TIMEOUT_S)[configured].result(TIMEOUT_S)
    wait_topic(admin, configured, 2)
    described = describe_topic(admin, configured)
    for name, value in configs.items():
        entry = described.get(name)
        check(entry is not None, f"{configured}: {name} not described")
        check(entry.value == value, f"{configured}: {name}={entry.value}, expected {value}")
        check(entry.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value,
              f"{configured}: {name} source {entry.source}, expected DYNAMIC_TOPIC_CONFIG")
    for name, value in [("retention.bytes", "-1"), ("index.interval.bytes", "4096"),
                        ("unclean.leader.election.enable", "false"), ("diskless.enable", "true")]:
        entry = described.get(name)
        check(entry is not None and entry.value == value,
              f"{configured}: {name} described as {entry}, expected the default {value}")
        check(entry.source == ConfigSource.DEFAULT_CONFIG.value and entry.is_default,
              f"{configured}: {name} source {entry.source}, expected DEFAULT_CONFIG")
    # segment.ms: the broker's --segment-ms (10 min), as Kafka describes a log.roll.ms set in
    # server.properties.
    ms = described["segment.ms"]
    check(ms.value == "600000" and ms.source == ConfigSource.STATIC_BROKER_CONFIG.value,
          f"{configured}: segment.ms described as {ms}, expected the broker's 600000")
    synonyms = [(s.name, s.value, s.source) for s in ms.synonyms.values()]
    check(synonyms == [("log.roll.ms", "600000", ConfigSource.STATIC_BROKER_CONFIG.value),
                       ("log.roll.hours", "168", ConfigSource.DEFAULT_CONFIG.value)],
          f"segment.ms synonyms {synonyms}")
    seg = described["segment.bytes"]
    synonyms = [(s.name, s.value) for s in seg.synonyms.values()]
    # (confluent-kafka keeps synonyms by name: of log.segment.bytes's static 268435456 and default
    # 1073741824 one is seen.)
    check(synonyms[0] == ("segment.bytes", "1048576")
          and [n for n, _ in synonyms] == ["segment.bytes", "log.segment.bytes"],
          f"segment.bytes synonyms {synonyms}")
    check(len(described) >= 30, f"only {len(described)} topic configs described")
    log(f"{configured}: {len(described)} configs described, sources and synonyms as Kafka's")

    # validate_only creates nothing.
    dry = unique("adm-dry")
    admin.create_topics([NewTopic(dry, num_partitions=5, replication_factor=-1)],
                        validate_only=True, request_timeout=TIMEOUT_S)[dry].result(TIMEOUT_S)
    t = topic_metadata(admin, dry)
    check(t is not None and t.error is not None and t.error.name() == "UNKNOWN_TOPIC_OR_PART",
          f"{dry}: validate_only created the topic: {t}")
    log(f"{dry}: validate_only created nothing")

    # Refusals.
    underscored = unique("adm_coll")
    admin.create_topics([NewTopic(underscored, num_partitions=1, replication_factor=-1)],
                        request_timeout=TIMEOUT_S)[underscored].result(TIMEOUT_S)
    refused = [
        (NewTopic("bad name!", num_partitions=1, replication_factor=-1), "TOPIC_EXCEPTION"),
        (NewTopic("x" * 250, num_partitions=1, replication_factor=-1), "TOPIC_EXCEPTION"),
        (NewTopic(unique("adm-unknown-cfg"), num_partitions=1, replication_factor=-1,
                  config={"no.such.config": "1"}), "INVALID_CONFIG"),
        (NewTopic(unique("adm-policy"), num_partitions=1, replication_factor=-1,
                  config={"cleanup.policy": "shred"}), "INVALID_CONFIG"),
        (NewTopic(unique("adm-lags"), num_partitions=1, replication_factor=-1,
                  config={"cleanup.policy": "compact", "min.compaction.lag.ms": "10",
                          "max.compaction.lag.ms": "5"}), "INVALID_CONFIG"),
        (NewTopic(unique("adm-badvalue"), num_partitions=1, replication_factor=-1,
                  config={"retention.ms": "-7"}), "INVALID_CONFIG"),
        (NewTopic(unique("adm-badassign"), num_partitions=1, replica_assignment=[[1, 99]]),
         "INVALID_REPLICA_ASSIGNMENT"),
        (NewTopic(unique("adm-zero"), num_partitions=0, replication_factor=-1),
         "INVALID_PARTITIONS"),
        # Differs from an existing topic only in '.' versus '_' (Kafka's collision rule).
        (NewTopic(underscored.replace("_", "."), num_partitions=1, replication_factor=-1),
         "TOPIC_EXCEPTION"),
    ]
    for new_topic, expected in refused:
        future = admin.create_topics([new_topic], request_timeout=TIMEOUT_S)[new_topic.topic]
        expect_error(future, expected, f"CreateTopics {new_topic.topic[:40]!r} {new_topic.config}")

    # Metadata for an invalid name and for an unknown valid name (auto-creation is off).
    producer = Producer({"bootstrap.servers": bootstrap})
    for name, expected in [("bad name!", "TOPIC_EXCEPTION"),
                           (unique("adm-absent"), "UNKNOWN_TOPIC_OR_PART")]:
        t = topic_metadata(producer, name)
        check(t is not None and t.error is not None and t.error.name() == expected,
              f"Metadata {name!r}: {t and t.error}, expected {expected}")
        log(f"Metadata {name!r}: {expected}")
    t = topic_metadata(admin, name)
    check(t.error is not None, f"{name} was created although auto-creation is off")

    # A broker's configs.
    broker = ConfigResource(ResourceType.BROKER, "1")
    bc = admin.describe_configs([broker], request_timeout=TIMEOUT_S)[broker].result(TIMEOUT_S)
    check(bc.get("auto.create.topics.enable") is not None
          and bc["auto.create.topics.enable"].value == "false",
          f"broker configs: auto.create.topics.enable {bc.get('auto.create.topics.enable')}")
    check(bc["num.partitions"].value == "1" and bc["message.max.bytes"].value == "1048588",
          "broker configs: num.partitions / message.max.bytes")
    for name, value in [("log.roll.ms", "600000"), ("log.segment.bytes", "268435456")]:
        check(bc.get(name) is not None and bc[name].value == value
              and bc[name].source == ConfigSource.STATIC_BROKER_CONFIG.value,
              f"broker configs: {name} {bc.get(name)}, expected the static {value}")
    check(all(e.is_read_only for e in bc.values()), "broker configs should be read-only")
    log(f"broker 1: {len(bc)} configs described")
    return configured


def alter(admin, bootstrap, topic):
    res = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("max.message.bytes", "2000", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("retention.ms", "86400000", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("segment.ms", "60000", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("delete.retention.ms", None, incremental_operation=AlterConfigOpType.DELETE),
    ])
    admin.incremental_alter_configs([res], request_timeout=TIMEOUT_S)[res].result(TIMEOUT_S)
    described = describe_topic(admin, topic)
    for name, value, source in [
            ("max.message.bytes", "2000", ConfigSource.DYNAMIC_TOPIC_CONFIG),
            ("retention.ms", "86400000", ConfigSource.DYNAMIC_TOPIC_CONFIG),
            ("segment.ms", "60000", ConfigSource.DYNAMIC_TOPIC_CONFIG),
            ("segment.bytes", "1048576", ConfigSource.DYNAMIC_TOPIC_CONFIG),
            ("delete.retention.ms", "86400000", ConfigSource.DEFAULT_CONFIG)]:
        e = described[name]
        check(e.value == value and e.source == source.value,
              f"after IncrementalAlterConfigs: {name}={e.value} ({e.source}), expected {value}")
    log(f"{topic}: IncrementalAlterConfigs applied and described")

    # Produce validates with the new max.message.bytes at once.
    reports = {}

    def report(err, msg):
        reports[msg.value()[:5]] = err

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                         "compression.type": "none", "batch.num.messages": 1,
                         "linger.ms": 0, "message.send.max.retries": 0})
    producer.produce(topic, value=b"small" + b"s" * 100, partition=0, on_delivery=report)
    producer.flush(TIMEOUT_S)
    producer.produce(topic, value=b"large" + b"l" * 5000, partition=0, on_delivery=report)
    check(producer.flush(TIMEOUT_S) == 0, "not every delivery report arrived")
    check(reports.get(b"small") is None, f"the small message failed: {reports.get(b'small')}")
    err = reports.get(b"large")
    check(err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE,
          f"a 5000-byte message with max.message.bytes=2000: {err}")
    log(f"{topic}: a message over the new max.message.bytes is refused ({err.name()})")

    # Refused alterations.
    for entry, expected in [
            (ConfigEntry("cleanup.policy", "shred", incremental_operation=AlterConfigOpType.APPEND),
             "INVALID_CONFIG"),
            (ConfigEntry("retention.ms", "1", incremental_operation=AlterConfigOpType.APPEND),
             "INVALID_CONFIG"),
            (ConfigEntry("no.such.config", "1", incremental_operation=AlterConfigOpType.SET),
             "INVALID_CONFIG")]:
        res = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[entry])
        future = admin.incremental_alter_configs([res], request_timeout=TIMEOUT_S)[res]
        expect_error(future, expected, f"IncrementalAlterConfigs {entry.name}")
    missing = ConfigResource(ResourceType.TOPIC, unique("adm-missing"), incremental_configs=[
        ConfigEntry("retention.ms", "1000", incremental_operation=AlterConfigOpType.SET)])
    expect_error(admin.incremental_alter_configs([missing], request_timeout=TIMEOUT_S)[missing],
                 "UNKNOWN_TOPIC_OR_PART", "IncrementalAlterConfigs of an unknown topic")
    check(describe_topic(admin, topic)["max.message.bytes"].value == "2000",
          "a refused alteration changed the topic")

    # validate_only changes nothing.
    res = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("max.message.bytes", "3000", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res], validate_only=True,
                                    request_timeout=TIMEOUT_S)[res].result(TIMEOUT_S)
    check(describe_topic(admin, topic)["max.message.bytes"].value == "2000",
          "validate_only changed max.message.bytes")

    # AlterConfigs (legacy): the given configs replace the set ones.
    res = ConfigResource(ResourceType.TOPIC, topic, set_config={"retention.bytes": "1000000"})
    admin.alter_configs([res], request_timeout=TIMEOUT_S)[res].result(TIMEOUT_S)
    described = describe_topic(admin, topic)
    check(described["retention.bytes"].value == "1000000", "AlterConfigs: retention.bytes")
    check(described["max.message.bytes"].value == "1048588"
          and described["max.message.bytes"].source == ConfigSource.DEFAULT_CONFIG.value,
          f"AlterConfigs did not reset max.message.bytes: {described['max.message.bytes']}")
    check(described["segment.bytes"].value == "268435456"
          and described["segment.bytes"].source == ConfigSource.STATIC_BROKER_CONFIG.value,
          f"AlterConfigs did not reset segment.bytes to the broker's: {described['segment.bytes']}")
    log(f"{topic}: AlterConfigs replaced the topic's configs")


def runtime_effect(admin, bootstrap):
    """message.timestamp.type and retention.ms changed at run time act on the next produce and the
    next retention pass."""
    topic = unique("adm-runtime")
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=-1)],
                        request_timeout=TIMEOUT_S)[topic].result(TIMEOUT_S)
    wait_topic(admin, topic, 1)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})
    # A CreateTime the producer chose, an hour ago: within the default retention.ms (7 days), so
    # the retention passes the broker runs every 500 ms leave it until retention.ms is lowered.
    old = int(time.time() * 1000) - 3_600_000

    def send(value):
        errors = []
        producer.produce(topic, value=value, partition=0, timestamp=old,
                         on_delivery=lambda err, msg: errors.append(err) if err else None)
        check(producer.flush(TIMEOUT_S) == 0 and not errors, f"produce {value}: {errors}")

    send(b"create-time")
    res = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("message.timestamp.type", "LogAppendTime",
                    incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res], request_timeout=TIMEOUT_S)[res].result(TIMEOUT_S)
    before = int(time.time() * 1000)
    send(b"log-append-time")
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("adm-rt"),
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition(topic, 0, 0)])
    got = []
    deadline = time.time() + TIMEOUT_S
    while len(got) < 2 and time.time() < deadline:
        m = consumer.poll(0.5)
        if m is not None and m.error() is None:
            got.append((m.value(), m.timestamp()))
    consumer.close()
    check(len(got) == 2, f"read {got}")
    check(got[0] == (b"create-time", (TIMESTAMP_CREATE_TIME, old)), f"first record {got[0]}")
    value, (ts_type, ts) = got[1]
    check(value == b"log-append-time" and ts_type == TIMESTAMP_LOG_APPEND_TIME and ts >= before,
          f"after message.timestamp.type=LogAppendTime: {got[1]}")
    log(f"{topic}: message.timestamp.type=LogAppendTime applies to the next produce")

    # retention.ms lowered: the next retention pass deletes both batches (the first one's CreateTime
    # is an hour ago, the second one's LogAppendTime is now).
    tp = TopicPartition(topic, 0)

    def log_start():
        return admin.list_offsets({tp: OffsetSpec.earliest()},
                                  request_timeout=TIMEOUT_S)[tp].result(TIMEOUT_S).offset

    time.sleep(1.5)  # several retention passes (--retention-check-ms 500) under the default
    check(log_start() < 2, f"{topic}: the fresh batch was deleted under the default retention.ms")
    res = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("retention.ms", "1000", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res], request_timeout=TIMEOUT_S)[res].result(TIMEOUT_S)
    deadline = time.time() + TIMEOUT_S
    while True:
        start = log_start()
        if start >= 2:
            break
        check(time.time() < deadline, f"{topic}: retention.ms=1000 deleted nothing (log start {start})")
        time.sleep(0.3)
    log(f"{topic}: retention.ms=1000 applied by the next retention pass (log start {start})")


def topic_compression(admin, bootstrap):
    """compression.type applies: records produced with any codec read back as sent, before and
    after the topic's codec changes (the stored codec itself is checked by the broker's Rust test
    tests/topic_compression.rs, which sees the batches)."""
    topic = unique("adm-codec")
    configs = {"compression.type": "gzip", "compression.gzip.level": "1"}
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=-1, config=configs)],
                        request_timeout=TIMEOUT_S)[topic].result(TIMEOUT_S)
    wait_topic(admin, topic, 1)
    described = describe_topic(admin, topic)
    for name, value in configs.items():
        check(described[name].value == value
              and described[name].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value,
              f"{topic}: {name} described as {described[name]}")
    sent = []
    # A minute ago: well within the default retention.ms of the passes the broker runs.
    base_ts = int(time.time() * 1000) - 60_000

    def send_all(round_):
        for codec in ("none", "gzip", "snappy", "lz4", "zstd"):
            producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 20,
                                 "compression.type": codec, "enable.idempotence": True})
            errors = []
            for i in range(20):
                key = None if i % 3 == 0 else f"{codec}-k{i}".encode()
                value = f"{round_} {codec} value {i} ".encode() * (1 + i % 5)
                headers = [("h", f"{i}".encode())] if i % 2 else None
                ts = base_ts + len(sent)
                producer.produce(topic, key=key, value=value, headers=headers, timestamp=ts,
                                 partition=0,
                                 on_delivery=lambda err, msg: errors.append(err) if err else None)
                sent.append((key, value, [("h", f"{i}".encode())] if i % 2 else None, ts))
            check(producer.flush(TIMEOUT_S) == 0 and not errors, f"{codec} producer: {errors}")

    send_all("gzip topic")
    res = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("compression.type", "zstd", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("compression.zstd.level", "12", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res], request_timeout=TIMEOUT_S)[res].result(TIMEOUT_S)
    described = describe_topic(admin, topic)
    check(described["compression.type"].value == "zstd"
          and described["compression.zstd.level"].value == "12",
          f"{topic}: after IncrementalAlterConfigs {described['compression.type']}")
    send_all("zstd topic")
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("adm-codec"),
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition(topic, 0, 0)])
    got = []
    deadline = time.time() + TIMEOUT_S
    while len(got) < len(sent) and time.time() < deadline:
        m = consumer.poll(0.5)
        if m is not None and m.error() is None:
            got.append((m.offset(), m.key(), m.value(), m.headers(), m.timestamp()[1]))
    consumer.close()
    check([o for o, *_ in got] == list(range(len(sent))), f"{topic}: offsets {[o for o, *_ in got]}")
    for (offset, key, value, headers, ts), want in zip(got, sent):
        check((key, value, headers, ts) == want,
              f"{topic}: offset {offset} read {(key, value, headers, ts)}, sent {want}")
    log(f"{topic}: {len(sent)} records of 5 codecs read back as sent under compression.type "
        "gzip (level 1), then zstd (level 12)")


def compacted_topic(admin, bootstrap):
    """cleanup.policy=compact applies (issue 29): described as set; a keyless record is refused
    with INVALID_RECORD (Kafka's LogValidator on a compacted topic), keyed ones and a tombstone
    are acknowledged and read back at their offsets. What compaction then removes is checked by
    the library's tests (diskless-core/tests/compaction_worker.rs)."""
    topic = unique("adm-compact")
    configs = {"cleanup.policy": "compact", "delete.retention.ms": "1000",
               "min.cleanable.dirty.ratio": "0.01", "min.compaction.lag.ms": "0"}
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=-1, config=configs)],
                        request_timeout=TIMEOUT_S)[topic].result(TIMEOUT_S)
    wait_topic(admin, topic, 1)
    described = describe_topic(admin, topic)
    for name, value in configs.items():
        check(described[name].value == value
              and described[name].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value,
              f"{topic}: {name} described as {described[name]}")
    reports = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0,
                         "batch.num.messages": 1, "message.send.max.retries": 0})
    for key, value in [(b"k1", b"v1"), (None, b"no key"), (b"k2", b"v2"), (b"k1", None)]:
        producer.produce(topic, key=key, value=value, partition=0,
                         on_delivery=lambda err, msg: reports.append((msg.key(), err)))
        producer.flush(TIMEOUT_S)
    check(len(reports) == 4, f"{topic}: {len(reports)} delivery reports")
    for key, err in reports:
        if key is None:
            check(err is not None and err.code() == KafkaError.INVALID_RECORD,
                  f"{topic}: a record without a key: {err}")
        else:
            check(err is None, f"{topic}: keyed record {key}: {err}")
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("adm-compact"),
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition(topic, 0, 0)])
    got = []
    deadline = time.time() + TIMEOUT_S
    while len(got) < 3 and time.time() < deadline:
        m = consumer.poll(0.5)
        if m is not None and m.error() is None:
            got.append((m.offset(), m.key(), m.value()))
    consumer.close()
    check(got == [(0, b"k1", b"v1"), (1, b"k2", b"v2"), (2, b"k1", None)],
          f"{topic}: read {got}")
    log(f"{topic}: compacted topic created; a keyless record refused with INVALID_RECORD")


def auto_create(admin, bootstrap):
    # A producer's Metadata creates the topic (LEADER_NOT_AVAILABLE first, then 2 partitions).
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})
    topic = unique("adm-auto")
    producer.list_topics(topic=topic, timeout=TIMEOUT_S)
    wait_topic(admin, topic, 2)
    log(f"{topic}: created by Metadata with num.partitions=2")

    # Producing to an unknown topic creates it.
    produced = unique("adm-auto-produce")
    errors = []
    for i in range(10):
        producer.produce(produced, value=f"m{i}".encode(),
                         on_delivery=lambda err, msg: errors.append(err) if err else None)
    check(producer.flush(TIMEOUT_S) == 0 and not errors, f"produce to a new topic: {errors}")
    wait_topic(admin, produced, 2)
    log(f"{produced}: created by producing to it")

    # A consumer does not create topics (allow_auto_topic_creation=false in Metadata v4+).
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("adm-g"),
                         "allow.auto.create.topics": False})
    absent = unique("adm-consumer-absent")
    t = topic_metadata(consumer, absent)
    check(t is not None and t.error is not None and t.error.name() == "UNKNOWN_TOPIC_OR_PART",
          f"consumer Metadata of {absent}: {t and t.error}")
    time.sleep(0.5)
    t = topic_metadata(consumer, absent)
    check(t.error is not None, f"{absent} was created for a consumer")
    consumer.close()
    log(f"{absent}: not created for a consumer (allow_auto_topic_creation=false)")

    # A name differing from an existing topic only in '.' versus '_' is not created (Kafka's
    # collision rule).
    dotted = unique("adm.coll")
    admin.create_topics([NewTopic(dotted, num_partitions=1, replication_factor=-1)],
                        request_timeout=TIMEOUT_S)[dotted].result(TIMEOUT_S)
    t = topic_metadata(producer, dotted.replace(".", "_"))
    check(t is not None and t.error is not None and t.error.name() == "TOPIC_EXCEPTION",
          f"Metadata of a name colliding with {dotted}: {t and t.error}")
    log(f"{dotted.replace('.', '_')}: collides with {dotted}, not created")

    # An invalid name is still refused.
    t = topic_metadata(producer, "bad name!")
    check(t is not None and t.error is not None and t.error.name() == "TOPIC_EXCEPTION",
          f"Metadata 'bad name!': {t and t.error}")
    broker = ConfigResource(ResourceType.BROKER, "1")
    bc = admin.describe_configs([broker], request_timeout=TIMEOUT_S)[broker].result(TIMEOUT_S)
    check(bc["auto.create.topics.enable"].value == "true"
          and bc["num.partitions"].value == "2", "broker configs of the auto-create broker")
    log("auto-creation as Kafka's auto.create.topics.enable=true")


def partitions(admin, bootstrap):
    """CreatePartitions: a topic grows (validate_only first), the new partitions take produce and
    fetch, a decrease or no change is INVALID_PARTITIONS, a wrong assignment count
    INVALID_REPLICA_ASSIGNMENT, an unknown topic UNKNOWN_TOPIC_OR_PARTITION; producer ids from the
    coordinator's blocks are distinct across producers."""
    from confluent_kafka.admin import NewPartitions
    topic = unique("grow")
    admin.create_topics([NewTopic(topic, num_partitions=2)])[topic].result(TIMEOUT_S)
    wait_topic(admin, topic, 2)
    admin.create_partitions([NewPartitions(topic, 4)], validate_only=True)[topic].result(TIMEOUT_S)
    check(len(topic_metadata(admin, topic).partitions) == 2, "validate_only grew the topic")
    admin.create_partitions([NewPartitions(topic, 4)])[topic].result(TIMEOUT_S)
    wait_topic(admin, topic, 4)
    expect_error(admin.create_partitions([NewPartitions(topic, 3)])[topic],
                 "INVALID_PARTITIONS", "decrease")
    expect_error(admin.create_partitions([NewPartitions(topic, 4)])[topic],
                 "INVALID_PARTITIONS", "no change")
    expect_error(admin.create_partitions([NewPartitions(topic, 6, replica_assignment=[[1]])])[topic],
                 "INVALID_REPLICA_ASSIGNMENT", "one assignment for two new partitions")
    admin.create_partitions([NewPartitions(topic, 6, replica_assignment=[[2, 1], [3, 2]])])[topic] \
        .result(TIMEOUT_S)
    wait_topic(admin, topic, 6)
    check_assignment(admin, topic, {4: [2, 1], 5: [3, 2]})
    missing = unique("missing")
    expect_error(admin.create_partitions([NewPartitions(missing, 2)])[missing],
                 "UNKNOWN_TOPIC_OR_PART", "unknown topic")
    # The new partition 3 takes records, from two idempotent producers with distinct ids.
    delivered = []
    for n in range(2):
        producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                             "linger.ms": 5})
        producer.produce(topic, value=f"p{n}".encode(), partition=3,
                         on_delivery=lambda err, msg: delivered.append((err, msg.offset())))
        check(producer.flush(TIMEOUT_S) == 0, "produce to a new partition not delivered")
    check([e for e, _ in delivered] == [None, None], f"produce to partition 3: {delivered}")
    check(sorted(o for _, o in delivered) == [0, 1], f"offsets in partition 3: {delivered}")
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("g"),
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 3, 0)])
    got = []
    deadline = time.time() + TIMEOUT_S
    while len(got) < 2 and time.time() < deadline:
        m = consumer.poll(0.5)
        if m is not None and m.error() is None:
            got.append((m.producer_id() if hasattr(m, "producer_id") else None, m.value()))
    consumer.close()
    check(sorted(v for _, v in got) == [b"p0", b"p1"], f"read back from partition 3: {got}")
    log("create_partitions ok:", topic)


KEPT_TOPIC = "kept-configs"
KEPT_GROUP = "kept-group"


def keep(admin):
    """Before a restart: a topic with a kept (no-effect) config, applied ones and a manual
    assignment, a group config."""
    admin.create_topics([NewTopic(KEPT_TOPIC, num_partitions=2, replica_assignment=[[2, 1], [1, 2]],
                                  config={"segment.jitter.ms": "1000", "segment.bytes": "1048576",
                                          "retention.ms": "3600000"})],
                        request_timeout=TIMEOUT_S)[KEPT_TOPIC].result(TIMEOUT_S)
    wait_topic(admin, KEPT_TOPIC, 2)
    res = ConfigResource(ResourceType.GROUP, KEPT_GROUP, incremental_configs=[
        ConfigEntry("consumer.heartbeat.interval.ms", "6000",
                    incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res], request_timeout=TIMEOUT_S)[res].result(TIMEOUT_S)
    log("topic configs, assignment and group config set")


def kept(admin):
    """After a restart: what keep() set is still there."""
    wait_topic(admin, KEPT_TOPIC, 2)
    described = describe_topic(admin, KEPT_TOPIC)
    for name, value in [("segment.jitter.ms", "1000"), ("segment.bytes", "1048576"),
                        ("retention.ms", "3600000")]:
        e = described[name]
        check(e.value == value and e.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value,
              f"after a restart: {name}={e.value} (source {e.source}), expected {value}")
    check_assignment(admin, KEPT_TOPIC, {0: [2, 1], 1: [1, 2]})
    res = ConfigResource(ResourceType.GROUP, KEPT_GROUP)
    e = admin.describe_configs([res], request_timeout=TIMEOUT_S)[res].result(TIMEOUT_S)[
        "consumer.heartbeat.interval.ms"]
    check(e.value == "6000" and e.source == ConfigSource.GROUP_CONFIG.value,
          f"after a restart: group config {e.value} (source {e.source})")
    log("topic configs, assignment and group config survived the restart")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--mode", choices=["plain", "auto", "keep", "kept"], required=True)
    args = parser.parse_args()
    admin = AdminClient({"bootstrap.servers": args.bootstrap})
    try:
        if args.mode == "plain":
            topic = create_and_refuse(admin, args.bootstrap)
            alter(admin, args.bootstrap, topic)
            runtime_effect(admin, args.bootstrap)
            topic_compression(admin, args.bootstrap)
            compacted_topic(admin, args.bootstrap)
            partitions(admin, args.bootstrap)
            group_configs(admin)
        elif args.mode == "keep":
            keep(admin)
        elif args.mode == "kept":
            kept(admin)
        else:
            auto_create(admin, args.bootstrap)
    except Failure as e:
        print(f"FAILED: {e}", file=sys.stderr, flush=True)
        sys.exit(1)
    log("ok")


if __name__ == "__main__":
    main()
