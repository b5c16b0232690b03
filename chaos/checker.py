"""The campaign's checker: each function takes what the clients recorded and what was read back,
and returns the violations as strings (empty: none). `test_checker.py` shows each one catches
every kind of violation it names.

Reads are {(topic, partition): {"high": high watermark, "records": [(offset, value)]}}.
"""


def check_plain(acked, read):
    """A topic without transactions or deletions. `acked`: {value: (partition, offset)}.
    Offsets strictly increasing and gap-free up to the high watermark; every acknowledged value
    read exactly once, at its acknowledged offset; no value read twice (an unacknowledged one may
    be read once or not at all)."""
    violations = []
    seen = {}
    for (topic, p), v in sorted(read.items()):
        last = -1
        for off, value in v["records"]:
            if off <= last:
                violations.append(f"{topic}/{p}: offset {off} after {last} (not increasing)")
            elif off != last + 1:
                violations.append(f"{topic}/{p}: offsets {last + 1}..{off - 1} missing (a gap)")
            last = off
            if value in seen:
                violations.append(f"duplicate: {value} at {topic}/{p}@{off} and "
                                  f"{seen[value][0]}@{seen[value][1]}")
            else:
                seen[value] = (p, off)
        if last != v["high"] - 1:
            violations.append(f"{topic}/{p}: read up to offset {last}, high watermark {v['high']}")
    for value, (p, off) in sorted(acked.items()):
        where = seen.get(value)
        if where is None:
            violations.append(f"lost: {value} acknowledged at p{p}@{off}, never read")
        elif where != (p, off):
            violations.append(f"moved: {value} acknowledged at p{p}@{off}, "
                              f"read at p{where[0]}@{where[1]}")
    return violations


def _index(read, label, violations):
    """{value: (topic, p, offset)} of a read, reporting duplicates and offsets not increasing."""
    seen = {}
    for (topic, p), v in sorted(read.items()):
        last = -1
        for off, value in v["records"]:
            if off <= last:
                violations.append(f"{label} {topic}/{p}: offset {off} after {last} "
                                  f"(not increasing)")
            last = off
            if value in seen:
                violations.append(f"{label} duplicate: {value} at {topic}/{p}@{off} and "
                                  f"{seen[value][0]}/{seen[value][1]}@{seen[value][2]}")
            else:
                seen[value] = (topic, p, off)
    return seen


def check_txns(txns, uncommitted, committed):
    """Transactional topics. `txns`: [{"id", "records": [(topic, p, value)], "acked": {value:
    (topic, p, offset)}, "outcome": committed | aborted | unknown}]; `uncommitted` and
    `committed`: reads under read_uncommitted and read_committed.

    - no value read twice, offsets strictly increasing (both reads);
    - read_committed shows a subset of read_uncommitted, each value at the same offset;
    - a committed transaction: every record visible to read_committed, at its acknowledged
      offset; an aborted one: none; an unknown one: all or none;
    - gaps in read_uncommitted: at most one offset (its marker) per transaction that wrote to
      the partition;
    - no transaction left open at the end."""
    violations = []
    all_seen = _index(uncommitted, "read_uncommitted", violations)
    visible = _index(committed, "read_committed", violations)
    for value, where in sorted(visible.items()):
        if all_seen.get(value) != where:
            violations.append(f"read_committed shows {value} at {where}, read_uncommitted at "
                              f"{all_seen.get(value)}")
    touching = {}
    for txn in txns:
        for topic, p, _ in txn["records"]:
            touching[(topic, p)] = touching.get((topic, p), 0) + 1
        shown = [value for _, _, value in txn["records"] if value in visible]
        outcome = txn["outcome"]
        if outcome is None:
            violations.append(f"transaction {txn['id']} left open")
        elif outcome == "committed":
            for topic, p, value in txn["records"]:
                where = visible.get(value)
                if where is None:
                    violations.append(f"committed transaction {txn['id']}: {value} "
                                      f"({topic}/{p}) not visible to read_committed")
                elif value in txn["acked"] and txn["acked"][value] != where:
                    violations.append(f"committed transaction {txn['id']}: {value} "
                                      f"acknowledged at {txn['acked'][value]}, read at {where}")
        elif outcome == "aborted":
            for value in shown:
                violations.append(f"aborted transaction {txn['id']}: {value} visible to "
                                  f"read_committed at {visible[value]}")
        elif shown and len(shown) != len(txn["records"]):
            violations.append(f"transaction {txn['id']} (outcome unknown) partly visible: "
                              f"{len(shown)} of {len(txn['records'])} records")
    for (topic, p), v in sorted(uncommitted.items()):
        offsets = [off for off, _ in v["records"]]
        gaps = sum(b - a - 1 for a, b in zip([-1] + offsets, offsets + [v["high"]]))
        if gaps > touching.get((topic, p), 0):
            violations.append(f"{topic}/{p}: {gaps} offsets without a record, more than the "
                              f"{touching.get((topic, p), 0)} transactions that wrote there")
    return violations


def check_group(commits, observed, final):
    """Committed group offsets. `commits`: [(time, {p: offset})] the broker accepted;
    `observed`: [(time, {p: offset})] read by another client; `final`: {p: offset} read at the end
    (None: could not be read). Observed offsets never move backwards; the final one is at least
    every accepted commit and every observation (an accepted commit is durable)."""
    violations = []
    if final is None:
        return ["group: committed offsets could not be read at the end"]
    last = {}
    for t, offsets in observed:
        for p, off in offsets.items():
            if off < last.get(p, (-1, 0))[0]:
                violations.append(f"group p{p}: committed offset went back from "
                                  f"{last[p][0]} to {off} (observed at {t:.1f})")
            last[p] = (off, t)
    for label, history in (("accepted commit", commits), ("observation", observed)):
        for t, offsets in history:
            for p, off in offsets.items():
                if final.get(p, -1) < off:
                    violations.append(f"group p{p}: {label} of offset {off} at {t:.1f} lost: "
                                      f"final committed offset {final.get(p)}")
    return violations


def check_leaks(stored, known, live):
    """Storage against the coordinator once the lifecycle workers ran. `stored`: the keys in the
    bucket; `known`: every object key the coordinator has a row for; `live`: those with live
    bytes. Every object in storage is known (no leak: orphan collection deleted what was never
    committed); every live object is in storage (nothing deleted under a reader)."""
    violations = [f"leak: object {key} in storage, unknown to the coordinator"
                  for key in sorted(set(stored) - set(known))]
    violations += [f"missing: live object {key} not in storage"
                   for key in sorted(set(live) - set(stored))]
    return violations


def check_live(label, seen, final, gap_free=False, txns=None):
    """A reader that ran during the faults. `seen`: [(time, topic, p, offset, value)] in the order
    it was handed the records; `final`: the read at the end under the same isolation level.
    - offsets strictly increasing per partition (and, with `gap_free`, from 0 without a gap: a
      topic without transactions or deletions);
    - each record seen is the final read's record at that offset (nothing seen that later went
      away or changed: an uncommitted, aborted or rolled-back record under read_committed, a
      record a restart lost under read_uncommitted);
    - with `txns` (the transactional producers' records, with `commit_at`: the monotonic time the
      commit was sent, None when it never was): no record seen before its transaction's commit
      was sent (the last stable offset passed it early)."""
    violations = []
    at = {tp: dict(v["records"]) for tp, v in final.items()}
    owner = {}
    for txn in txns or []:
        for _, _, value in txn["records"]:
            owner[value] = txn
    last = {}
    for t, topic, p, off, value in seen:
        prev = last.get((topic, p), -1)
        if off <= prev:
            violations.append(f"{label} {topic}/{p}: offset {off} after {prev} (not increasing)")
        elif gap_free and off != prev + 1:
            violations.append(f"{label} {topic}/{p}: offsets {prev + 1}..{off - 1} skipped")
        last[(topic, p)] = off
        there = at.get((topic, p), {}).get(off)
        if there != value:
            violations.append(f"{label} saw {value} at {topic}/{p}@{off}; the final read has "
                              f"{there if there is not None else 'nothing'} there")
        txn = owner.get(value)
        if txn is not None and (txn["commit_at"] is None or t < txn["commit_at"]):
            violations.append(f"{label} saw {value} of transaction {txn['id']} before its "
                              f"commit was sent")
    return violations
