#!/usr/bin/env python3
"""The campaign's checker must catch what it claims to (run by .ci/chaos before the campaign):
for each check, a clean history passes and every kind of violation it names is reported."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checker import check_group, check_leaks, check_live, check_plain, check_txns  # noqa: E402


def history(records, high=None, topic="t", p=0):
    return {(topic, p): {"high": len(records) if high is None else high, "records": records}}


def expect(name, check, clean, cases):
    assert check(*clean) == [], f"{name}: a clean history gave {check(*clean)}"
    for word, args in cases.items():
        found = check(*args)
        assert any(word in v for v in found), f"{name}: {word}: the checker said {found}"
    return len(cases)


def plain():
    acked = {"a": (0, 0), "b": (0, 1)}
    clean = (acked, history([(0, "a"), (1, "b"), (2, "c")]))  # c unacknowledged, read once
    return expect("plain", check_plain, clean, {
        "lost": (acked, history([(0, "a")], high=1)),
        "moved": (acked, history([(0, "b"), (1, "a")])),
        "duplicate": (acked, history([(0, "a"), (1, "b"), (2, "b")])),
        "gap": (acked, history([(0, "a"), (1, "b"), (3, "c")], high=4)),
        "not increasing": (acked, history([(0, "a"), (1, "b"), (1, "c")])),
        "high watermark": (acked, history([(0, "a"), (1, "b")], high=5)),
    })


def txns():
    def txn(i, outcome, values, acked=True):
        records = [("t", 0, v) for v in values]
        return {"id": f"x{i}", "records": records, "outcome": outcome,
                "acked": {v: ("t", 0, off) for v, off in acked.items()} if isinstance(acked, dict)
                else {}}
    # x1 committed (offsets 0, 1, marker 2), x2 aborted (3, marker 4), x3 unknown, not visible
    # (5, marker 6), x4 unknown, committed (7, marker 8).
    log = [(0, "a"), (1, "b"), (3, "c"), (5, "d"), (7, "e")]
    ok = [txn(1, "committed", ["a", "b"], {"a": 0, "b": 1}), txn(2, "aborted", ["c"]),
          txn(3, "unknown", ["d"]), txn(4, "unknown", ["e"])]
    committed = [(0, "a"), (1, "b"), (7, "e")]
    clean = (ok, history(log, high=9), history(committed, high=9))
    half = [txn(1, "committed", ["a", "b"]), txn(2, "unknown", ["c", "d"])]
    return expect("transactions", check_txns, clean, {
        "not visible": (ok, history(log, high=9), history([(0, "a"), (7, "e")], high=9)),
        "aborted transaction": (ok, history(log, high=9),
                                history(committed + [(8, "c")], high=9)),
        "partly visible": (half, history([(0, "a"), (1, "b"), (3, "c"), (4, "d")], high=6),
                           history([(0, "a"), (1, "b"), (3, "c")], high=6)),
        "acknowledged at": ([txn(1, "committed", ["a", "b"], {"a": 0, "b": 5})] + ok[1:],
                            history(log, high=9), history(committed, high=9)),
        "read_uncommitted at": (ok, history(log, high=9),
                                history([(0, "a"), (2, "b"), (7, "e")], high=9)),
        "left open": ([txn(1, None, ["a", "b"])] + ok[1:], history(log, high=9),
                      history(committed, high=9)),
        "more than": (ok, history(log, high=12), history(committed, high=12)),
        "duplicate": (ok, history(log + [(8, "a")], high=9), history(committed, high=9)),
    })


def group():
    commits = [(1.0, {0: 5}), (2.0, {0: 9})]
    observed = [(1.5, {0: 5}), (2.5, {0: 9})]
    return expect("group", check_group, (commits, observed, {0: 9}), {
        "went back": (commits, [(1.5, {0: 9}), (2.5, {0: 5})], {0: 9}),
        "accepted commit": (commits, observed[:1], {0: 5}),
        "could not be read": (commits, observed, None),
    })


def leaks():
    return expect("leaks", check_leaks, (["a", "b"], {"a": 1, "b": 0, "c": 0}, ["a"]), {
        "leak": (["a", "x"], {"a": 1}, ["a"]),
        "missing": (["b"], {"a": 1, "b": 1}, ["a", "b"]),
    })


def live():
    final = history([(0, "a"), (1, "b"), (3, "c")], high=5)
    txn = [{"id": "x1", "records": [("t", 0, "c")], "commit_at": 5.0}]
    clean = ("r", [(1.0, "t", 0, 0, "a"), (2.0, "t", 0, 1, "b"), (6.0, "t", 0, 3, "c")], final,
             False, txn)
    plain = history([(0, "a"), (1, "b"), (2, "c")])
    assert check_live("r", [(1.0, "t", 0, 0, "a"), (1.0, "t", 0, 1, "b")], plain, True) == []
    return expect("live", check_live, clean, {
        "not increasing": ("r", [(1.0, "t", 0, 1, "b"), (2.0, "t", 0, 0, "a")], final, False,
                           txn),
        "skipped": ("r", [(1.0, "t", 0, 0, "a"), (2.0, "t", 0, 2, "c")], plain, True, None),
        "final read has": ("r", [(1.0, "t", 0, 0, "a"), (2.0, "t", 0, 2, "x")], final, False,
                           txn),
        "before its commit": ("r", [(4.0, "t", 0, 3, "c")], final, False, txn),
    }) + expect("live, never committed", check_live, ("r", [], final, False, txn), {
        "before its commit": ("r", [(9.0, "t", 0, 3, "c")], final, False,
                              [{**txn[0], "commit_at": None}]),
    })


def main():
    n = plain() + txns() + group() + leaks() + live()
    print(f"checker: {n} kinds of violation caught, clean histories pass")


if __name__ == "__main__":
    main()
