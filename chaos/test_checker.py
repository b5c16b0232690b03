#!/usr/bin/env python3
"""The campaign's checker must catch what it claims to: lost, moved and duplicated records, gaps,
and a read that stops short of the high watermark (run by .ci/chaos before the campaign)."""

import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))
from campaign import check  # noqa: E402


def history(records, high=None):
    return {0: {"high": len(records) if high is None else high, "records": records}}


def main():
    acked = {"a": (0, 0), "b": (0, 1)}
    ok = history([(0, "a"), (1, "b"), (2, "c")])  # c unacknowledged, read once: allowed
    assert check(acked, ok) == [], check(acked, ok)
    cases = {
        "lost": history([(0, "a")], high=1),
        "moved": history([(0, "b"), (1, "a")]),
        "duplicate": history([(0, "a"), (1, "b"), (2, "b")]),
        "gap": history([(0, "a"), (1, "b"), (3, "c")], high=4),
        "not increasing": history([(0, "a"), (1, "b"), (1, "c")]),
        "high watermark": history([(0, "a"), (1, "b")], high=5),
    }
    for word, h in cases.items():
        found = check(acked, h)
        assert any(word in v for v in found), f"{word}: the checker said {found}"
    print(f"checker: {len(cases)} kinds of violation caught, a clean history passes")


if __name__ == "__main__":
    main()
