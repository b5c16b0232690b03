#!/usr/bin/env python3
"""Consumer groups of the diskless example broker with a real Kafka client (confluent-kafka).

Scenarios (--scenario):
  restart  a group consumer reads and commits; the caller restarts the broker (the script prints
           RESTART-BROKER and waits for a line on stdin); the same consumer reads what is produced
           after the restart and commits again: no rebalance (no assignment callback after the
           first), no ILLEGAL_GENERATION, no record delivered twice, committed offsets at the end;
           the admin client describes the group with the member it had before the restart.
  static   two static members (group.instance.id); one is closed (no LeaveGroup: static) and
           restarted with the same instance id: it gets its old partitions, and the other member
           sees no rebalance; once both are closed they expire at their session timeout and the
           empty group can be deleted.
  admin    list_consumer_groups (with and without a states filter), describe_consumer_groups,
           delete_consumer_groups (NON_EMPTY_GROUP while the group has members,
           GROUP_ID_NOT_FOUND for an unknown group), as on Kafka.

Usage: groups.py --bootstrap HOST:PORT[,...] --scenario restart|static|admin
Exit status 0 on success; a failure prints what differs and exits 1.
"""

import argparse
import sys
import time

from confluent_kafka import (ConsumerGroupState, Consumer, KafkaError, KafkaException, Producer,
                             TopicPartition)
from confluent_kafka.admin import AdminClient, NewTopic
from harness import Failure, check, logger, client_conf

TIMEOUT_S = 60


log = logger("groups")


common = client_conf


def create_topic(admin, topic, partitions):
    futures = admin.create_topics(
        [NewTopic(topic, num_partitions=partitions, replication_factor=-1)], operation_timeout=30)
    futures[topic].result(timeout=TIMEOUT_S)


def produce(bootstrap, topic, values):
    p = Producer({**common(bootstrap, "groups-producer"), "enable.idempotence": True})
    errors = []
    for i, v in enumerate(values):
        p.produce(topic, key=str(i).encode(), value=v.encode(),
                  on_delivery=lambda err, msg: errors.append(err) if err else None)
    check(p.flush(TIMEOUT_S) == 0, "produce: messages left unflushed")
    check(not errors, f"produce errors: {errors}")


class Member:
    """A group consumer that records its rebalance callbacks and what it reads."""

    def __init__(self, bootstrap, group, name, extra=None):
        self.name = name
        self.assigns = []
        self.revokes = []
        self.records = []
        self.errors = []
        conf = {
            **common(bootstrap, name),
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 30000,
            "heartbeat.interval.ms": 500,
            "error_cb": lambda e: self.errors.append(e),
        }
        conf.update(extra or {})
        self.c = Consumer(conf)

    def subscribe(self, topics):
        self.c.subscribe(
            topics,
            on_assign=lambda c, ps: self.assigns.append(sorted((p.topic, p.partition) for p in ps)),
            on_revoke=lambda c, ps: self.revokes.append(sorted((p.topic, p.partition) for p in ps)))

    def poll(self, seconds):
        end = time.time() + seconds
        while time.time() < end:
            m = self.c.poll(0.1)
            if m is None:
                continue
            check(m.error() is None or m.error().code() == KafkaError._PARTITION_EOF,
                  f"{self.name}: consume error {m.error()}")
            if m.error() is None:
                self.records.append((m.topic(), m.partition(), m.offset(), m.value().decode()))

    def read_until(self, count, what):
        deadline = time.time() + TIMEOUT_S
        while len(self.records) < count and time.time() < deadline:
            self.poll(0.2)
        check(len(self.records) >= count,
              f"{self.name}: read {len(self.records)} of {count} records ({what}); "
              f"assignments {self.assigns}, errors {self.errors}")

    def commit(self):
        """A synchronous commit of the positions; raises on any error."""
        out = self.c.commit(asynchronous=False)
        for tp in out:
            check(tp.error is None, f"{self.name}: commit of {tp.topic}[{tp.partition}]: {tp.error}")
        return out


# The static members' session timeout: long enough for a restart, short for the expiry check.
STATIC_SESSION_MS = 6000


def wait_assigned(members, seconds=TIMEOUT_S):
    deadline = time.time() + seconds
    while time.time() < deadline:
        for m in members:
            m.poll(0.2)
        if all(m.assigns and m.c.assignment() for m in members):
            return
    raise Failure(f"members not assigned in time: {[(m.name, m.assigns) for m in members]}")


def describe(admin, group):
    return admin.describe_consumer_groups([group])[group].result(timeout=TIMEOUT_S)


# ---------------------------------------------------------------------------------------------


def scenario_restart(bootstrap):
    admin = AdminClient(common(bootstrap, "groups-admin"))
    topic, group, partitions = "groups-restart", "groups-restart-g", 3
    create_topic(admin, topic, partitions)
    produce(bootstrap, topic, [f"before-{i}" for i in range(300)])
    m = Member(bootstrap, group, "restart-member")
    m.subscribe([topic])
    m.read_until(300, "before the restart")
    m.commit()
    before = describe(admin, group)
    check(before.state == ConsumerGroupState.STABLE, f"state before the restart: {before.state}")
    check(len(before.members) == 1, f"members before the restart: {before.members}")
    member_id = before.members[0].member_id
    log(f"read and committed 300 records; member {member_id}; restarting the broker")

    print("RESTART-BROKER", flush=True)
    line = sys.stdin.readline().strip()
    check(line == "RESTARTED", f"expected RESTARTED on stdin, got {line!r}")
    log("broker restarted")

    # The group and its member survived the restart.
    after = describe(AdminClient(common(bootstrap, "groups-admin-2")), group)
    check(after.state == ConsumerGroupState.STABLE, f"state after the restart: {after.state}")
    check([x.member_id for x in after.members] == [member_id],
          f"members after the restart: {[x.member_id for x in after.members]}, want {member_id}")

    produce(bootstrap, topic, [f"after-{i}" for i in range(150)])
    m.read_until(450, "after the restart")
    m.poll(2)
    # The first commit after the restart, with the generation and member id of before.
    m.commit()
    values = [r[3] for r in m.records]
    dups = sorted({v for v in values if values.count(v) > 1})
    check(not dups, f"records delivered twice: {dups[:10]} ({len(dups)})")
    check(sorted(values) == sorted([f"before-{i}" for i in range(300)] +
                                   [f"after-{i}" for i in range(150)]),
          f"read {len(values)} records, not the 450 produced")
    check(len(m.assigns) == 1 and not m.revokes,
          f"a rebalance happened: assignments {m.assigns}, revocations {m.revokes}")
    for e in m.errors:
        check(e.code() != KafkaError.ILLEGAL_GENERATION, f"consumer error {e}")

    committed = m.c.committed([TopicPartition(topic, p) for p in range(partitions)],
                              timeout=TIMEOUT_S)
    for tp in committed:
        _, high = m.c.get_watermark_offsets(TopicPartition(topic, tp.partition), timeout=TIMEOUT_S)
        check(tp.offset == high, f"committed {tp.offset} != end {high} on partition {tp.partition}")
    m.c.close()
    log("after the restart: no rebalance, commits accepted, 450 records read exactly once")


def scenario_static(bootstrap):
    admin = AdminClient(common(bootstrap, "groups-admin"))
    topic, group = "groups-static", "groups-static-g"
    create_topic(admin, topic, 4)
    produce(bootstrap, topic, [f"s-{i}" for i in range(40)])

    def member(instance):
        m = Member(bootstrap, group, f"static-{instance}",
                   {"group.instance.id": instance, "session.timeout.ms": STATIC_SESSION_MS})
        m.subscribe([topic])
        return m

    a, b = member("instance-a"), member("instance-b")
    wait_assigned([a, b])
    # Let the group settle (both members in one generation).
    deadline = time.time() + TIMEOUT_S
    while time.time() < deadline:
        a.poll(0.5)
        b.poll(0.5)
        parts = sorted(p for m in (a, b) for p in m.assigns[-1])
        if len(parts) == 4 and len(set(parts)) == 4:
            break
    a_parts, b_parts = a.assigns[-1], b.assigns[-1]
    check(len(a_parts) == 2 and len(b_parts) == 2, f"assignments {a_parts} {b_parts}")
    b_callbacks = (len(b.assigns), len(b.revokes))
    d = describe(admin, group)
    check(d.state == ConsumerGroupState.STABLE, f"state {d.state}")
    instances = sorted(x.group_instance_id for x in d.members)
    check(instances == ["instance-a", "instance-b"], f"instance ids {instances}")
    old_a = [x.member_id for x in d.members if x.group_instance_id == "instance-a"][0]
    log(f"static members stable: a={a_parts} b={b_parts}")

    # a restarts: a static member's close sends no LeaveGroup; it rejoins with a new member id.
    a.c.close()
    d = describe(admin, group)
    check(len(d.members) == 2, f"a static member's close removed it: {d.members}")
    a2 = member("instance-a")
    wait_assigned([a2])
    # Give a rebalance, if any, the time to reach b.
    for _ in range(10):
        a2.poll(0.25)
        b.poll(0.25)
    check(a2.assigns[-1] == a_parts, f"restarted static member got {a2.assigns[-1]}, had {a_parts}")
    check((len(b.assigns), len(b.revokes)) == b_callbacks,
          f"the other member rebalanced: assignments {b.assigns}, revocations {b.revokes}")
    d = describe(admin, group)
    check(d.state == ConsumerGroupState.STABLE, f"state {d.state}")
    new_a = [x.member_id for x in d.members if x.group_instance_id == "instance-a"]
    check(len(new_a) == 1 and new_a[0] != old_a, f"member of instance-a: {new_a} (was {old_a})")
    a2.c.close()
    b.c.close()
    log("static member restarted with its old assignment, no rebalance of the other member")

    # Closed static members leave no LeaveGroup: they stay until their session times out, then the
    # group is empty and can be deleted (as librdkafka's 0081 test expects of Kafka).
    time.sleep(STATIC_SESSION_MS / 1000 + 1.5)
    futures = admin.delete_consumer_groups([group], request_timeout=TIMEOUT_S)
    try:
        futures[group].result(TIMEOUT_S)
    except KafkaException as e:
        raise Failure(f"static members not expired after their session timeout: {e}")
    log("closed static members expired at their session timeout; the empty group was deleted")


def scenario_admin(bootstrap):
    admin = AdminClient(common(bootstrap, "groups-admin"))
    topic = "groups-admin"
    create_topic(admin, topic, 2)
    produce(bootstrap, topic, [f"a-{i}" for i in range(20)])

    active = Member(bootstrap, "groups-admin-active", "admin-active")
    active.subscribe([topic])
    active.read_until(20, "active group")
    active.commit()

    # A group outside the group protocol: assign() and a commit (generation -1).
    simple = Consumer({**common(bootstrap, "admin-simple"), "group.id": "groups-admin-simple",
                       "enable.auto.commit": False})
    simple.commit(offsets=[TopicPartition(topic, 0, 5)], asynchronous=False)
    simple.close()

    listed = admin.list_consumer_groups().result(timeout=TIMEOUT_S)
    check(not listed.errors, f"list errors {listed.errors}")
    by_id = {g.group_id: g for g in listed.valid}
    check("groups-admin-active" in by_id and "groups-admin-simple" in by_id,
          f"listed groups {sorted(by_id)}")
    check(by_id["groups-admin-active"].state == ConsumerGroupState.STABLE,
          f"active group state {by_id['groups-admin-active'].state}")
    check(not by_id["groups-admin-active"].is_simple_consumer_group, "active group listed simple")
    check(by_id["groups-admin-simple"].state == ConsumerGroupState.EMPTY,
          f"simple group state {by_id['groups-admin-simple'].state}")
    check(by_id["groups-admin-simple"].is_simple_consumer_group, "simple group not listed simple")
    stable = admin.list_consumer_groups(states={ConsumerGroupState.STABLE}).result(timeout=TIMEOUT_S)
    stable_ids = {g.group_id for g in stable.valid}
    check("groups-admin-active" in stable_ids and "groups-admin-simple" not in stable_ids,
          f"groups listed as stable: {sorted(stable_ids)}")
    empty = admin.list_consumer_groups(states={ConsumerGroupState.EMPTY}).result(timeout=TIMEOUT_S)
    empty_ids = {g.group_id for g in empty.valid}
    check("groups-admin-simple" in empty_ids and "groups-admin-active" not in empty_ids,
          f"groups listed as empty: {sorted(empty_ids)}")

    d = describe(admin, "groups-admin-active")
    check(d.state == ConsumerGroupState.STABLE, f"describe state {d.state}")
    check(not d.is_simple_consumer_group, "described active group as simple")
    check(d.partition_assignor in ("range", "roundrobin", "cooperative-sticky"),
          f"assignor {d.partition_assignor!r}")
    check(len(d.members) == 1, f"members {d.members}")
    member = d.members[0]
    check(member.client_id == "admin-active", f"client id {member.client_id}")
    check(member.host.endswith("127.0.0.1"), f"host {member.host}")
    assigned = sorted((tp.topic, tp.partition) for tp in member.assignment.topic_partitions)
    check(assigned == [(topic, 0), (topic, 1)], f"described assignment {assigned}")
    d = describe(admin, "groups-admin-simple")
    check(d.state == ConsumerGroupState.EMPTY and not d.members and d.is_simple_consumer_group,
          f"simple group described as {d.state} {d.members} simple={d.is_simple_consumer_group}")

    def delete(group):
        try:
            admin.delete_consumer_groups([group])[group].result(timeout=TIMEOUT_S)
            return None
        except KafkaException as e:
            return e.args[0].code()

    check(delete("groups-admin-active") == KafkaError.NON_EMPTY_GROUP,
          "deleting a group with members did not answer NON_EMPTY_GROUP")
    check(delete("groups-admin-nobody") == KafkaError.GROUP_ID_NOT_FOUND,
          "deleting an unknown group did not answer GROUP_ID_NOT_FOUND")
    check(delete("groups-admin-simple") is None, "deleting the empty group failed")
    listed = {g.group_id for g in admin.list_consumer_groups().result(timeout=TIMEOUT_S).valid}
    check("groups-admin-simple" not in listed, f"deleted group still listed: {sorted(listed)}")

    # Once the member leaves, the group is empty and can be deleted, with its offsets.
    active.c.close()
    check(describe(admin, "groups-admin-active").state == ConsumerGroupState.EMPTY,
          "group not empty after its member left")
    check(delete("groups-admin-active") is None, "deleting the emptied group failed")
    c = Consumer({**common(bootstrap, "admin-check"), "group.id": "groups-admin-active"})
    committed = c.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=TIMEOUT_S)
    c.close()
    check(all(tp.offset < 0 for tp in committed),
          f"offsets of the deleted group remain: {[(tp.partition, tp.offset) for tp in committed]}")
    log("list/describe/delete consumer groups answer as Kafka")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--scenario", required=True, choices=["restart", "static", "admin"])
    args = parser.parse_args()
    try:
        {"restart": scenario_restart, "static": scenario_static,
         "admin": scenario_admin}[args.scenario](args.bootstrap)
    except Failure as e:
        print(f"[groups] FAILED: {e}", flush=True)
        sys.exit(1)
    log("OK")


if __name__ == "__main__":
    main()
