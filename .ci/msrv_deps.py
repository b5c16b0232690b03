"""Fails when a dependency in Cargo.lock declares a newer rust-version than the workspace's MSRV.

Reads `cargo metadata --format-version 1` on stdin; argv[1] is the declared MSRV.
"""
import json
import sys


def version(s):
    return (tuple(int(x) for x in s.split(".")) + (0, 0, 0))[:3]


msrv = version(sys.argv[1])
newer = [
    f"{p['name']} {p['version']} needs {p['rust_version']}"
    for p in json.load(sys.stdin)["packages"]
    if p.get("rust_version") and version(p["rust_version"]) > msrv
]
if newer:
    print("dependencies need a newer Rust than the declared MSRV:\n  " + "\n  ".join(newer))
    sys.exit(1)
print(f"every dependency builds with the declared MSRV {sys.argv[1]}")
