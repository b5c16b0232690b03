#!/usr/bin/env python3
"""Compare a client test suite's results with its exclusion list and print a summary.

Usage:
  report.py excluded  SUITE.exclude [--kind KIND]...   print the excluded test ids (one a line)
  report.py numbers   SUITE.exclude TEST_C SCENARIO [--kind KIND]...
                      librdkafka test numbers to run in SCENARIO, less the tests excluded as KIND
  report.py subtests  SUITE.exclude                   the subtest runs of `subtests` entries, one a
                      line: `<test number> <subtest>`
  report.py librdkafka SUITE.exclude RUN_DIR...         check librdkafka test-runner reports
  report.py pytest     SUITE.exclude JUNIT.xml          check a pytest --junitxml report

An exclusion list has one test a line: `<test id> <kind> <reason...>`; lines starting with `#` are
comments.
Kinds:
  unsupported  a feature the project decided against or cannot have (TLS, SASL, ACLs, ZooKeeper,
               several real replicas, compaction, ...): never run.
  pending      a broker gap found by the suite (missing API, wrong behaviour; issue #18) or a
               feature not built yet (transactions): not run in CI; `CLIENT_SUITES_PENDING=1`
               runs them and the report says which pass now (remove those lines).
  client       the test checks the client alone (librdkafka's mock cluster, unit tests) or
               needs the suite's own tooling (Kafka's CLI scripts): not run.
  quick        not an exclusion: librdkafka runs the test in quick mode (-Q, only the subtests
               marked quick) because the full test takes too long for CI; it must pass.
  subtests     the whole test is not run (the reason says why); the first word of the reason is a
               comma-separated list of its subtests (librdkafka's SUBTESTS=, a substring of the
               subtest name), each run on its own and reported as `<test>[<subtest>]`: they must pass.

The check fails (exit 1) when a test that is not excluded failed or did not finish, or when the
report is missing tests (the runner crashed); excluded tests that were run anyway and passed are
listed so the list can shrink.
"""

import glob
import json
import os
import re
import sys
import xml.etree.ElementTree as ET

KINDS = ("unsupported", "pending", "client", "quick", "subtests")
ANSI = re.compile(r"\x1b(\[[0-9;]*m|\(B)")


def read_exclusions(path):
    """Return {test id: (kind, reason)} from an exclusion list."""
    out = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split(None, 2)
            if len(parts) < 3 or parts[1] not in KINDS:
                sys.exit(f"{path}:{n}: expected `<test id> <{'|'.join(KINDS)}> <reason>`")
            if parts[0] in out:
                sys.exit(f"{path}:{n}: {parts[0]} listed twice")
            if parts[1] == "subtests" and not re.fullmatch(r"[A-Za-z0-9_]+(,[A-Za-z0-9_]+)*", parts[2].split()[0]):
                sys.exit(f"{path}:{n}: a `subtests` entry starts its reason with name,name,...")
            out[parts[0]] = (parts[1], parts[2])
    return out


def librdkafka_tests(test_c):
    """{test name: (scenarios, not run by `-L`)} from the table in librdkafka's tests/test.c."""
    with open(test_c, encoding="utf-8", errors="replace") as f:
        text = f.read()
    out = {}
    for m in re.finditer(r"\b_TEST\(\s*([0-9]{4}_[A-Za-z0-9_]+)", text):
        depth, i = 1, m.end()
        while depth and i < len(text):
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        body = text[m.end() : i]
        scenario = re.search(r'\.scenario\s*=\s*"([^"]*)"', body)
        # -L leaves out local tests (no broker needed); manual tests run only when named.
        skipped = "TEST_F_MANUAL" in body or "TEST_F_LOCAL" in body
        out[m.group(1)] = (scenario.group(1) if scenario else "default", skipped)
    return out


def librdkafka_numbers(test_c, exclusions, scenario, kinds):
    """Test numbers with a test in the scenario that is neither local, manual nor excluded.

    The runner selects tests by number (TESTS=0045 runs every 0045_* test of the scenario), so a
    number is run when any of its tests is wanted; an excluded test of that number may run too and
    is then reported as excluded.
    """
    numbers = set()
    for name, (scenarios, not_run) in librdkafka_tests(test_c).items():
        entry = exclusions.get(name)
        if not_run or scenario not in scenarios or (entry and entry[0] in kinds):
            continue
        numbers.add(name[:4])
    return sorted(numbers)


def librdkafka_merged(run_dirs):
    """Results of several passes (scenarios): a test's result is the one of the pass that ran it."""
    out = {}
    for run_dir in run_dirs:
        for name, result in librdkafka_results(run_dir).items():
            if name not in out or out[name][0] in ("SKIPPED", "DNS"):
                out[name] = result
    return out


def librdkafka_results(run_dir):
    """Return {test name: (state, duration s, failure text)} from a run directory.

    .ci/client-suites runs one test-runner per test number N, leaving ran-N, report-N.json (the
    runner's report, which lists every test) and log-N.txt. A test's result is taken from the run of
    its number; a run without a report (the runner was killed) fails every test of its number.
    """
    out = {}
    # One runner per test number N: ran-N, report-N.json, log-N.txt; and one per chosen subtest S of a
    # `subtests` entry: sub-N@S, report-N@S.json, log-N@S.txt, reported as `<test>[S]`.
    runs = [(m.rsplit("-", 1)[1], "") for m in glob.glob(os.path.join(run_dir, "ran-*"))]
    runs += [(os.path.basename(m)[len("sub-"):], "sub") for m in glob.glob(os.path.join(run_dir, "sub-*"))]
    for run, kind in sorted(runs):
        number, _, subtest = run.partition("@")
        suffix = f"[{subtest}]" if kind == "sub" else ""
        log_path = os.path.join(run_dir, f"log-{run}.txt")
        failures = librdkafka_failures(log_path)
        try:
            with open(os.path.join(run_dir, f"report-{run}.json"), encoding="utf-8", errors="replace") as f:
                report = json.loads(f.read(), strict=False)
        except (OSError, ValueError):
            out[number + suffix] = ("FAILED", 0.0, f"no report: the runner crashed or timed out, see {log_path}")
            continue
        for name, t in report.get("tests", {}).items():
            if not name.startswith(number):
                continue
            state = t.get("state", "?")
            text = failures.get(name, "") if state != "PASSED" else ""
            if state == "SKIPPED" and not text:
                text = t.get("extra", "")
            out[name + suffix] = (state, float(t.get("duration", 0.0)), text)
    return out


def librdkafka_failures(log_path):
    """{test name: first failure message} from a test-runner log."""
    out = {}
    try:
        with open(log_path, encoding="utf-8", errors="replace") as f:
            lines = [ANSI.sub("", l).rstrip("\n") for l in f]
    except OSError:
        return out
    for i, line in enumerate(lines):
        m = re.match(r'### Test "([0-9]{4}_[A-Za-z0-9_]+)', line)
        if m and m.group(1) not in out:
            detail = lines[i + 1] if i + 1 < len(lines) else ""
            out[m.group(1)] = detail[:200]
        m = re.match(r"\|\s*([0-9]{4}_[A-Za-z0-9_]+)\s*\|\s*SKIPPED\s*\|[^|]*\|\s*(.*)", line)
        if m and m.group(1) not in out:
            out[m.group(1)] = m.group(2)[:200]
    return out


def pytest_results(path):
    """Return {node id: (state, duration s, failure text)} from a junit XML report."""
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        classname = case.get("classname", "")
        # test.integration.test_admin_integration[.Class] -> test/integration/test_admin_integration.py[::Class]
        parts = classname.split(".")
        module_end = next((i for i, p in enumerate(parts) if p.startswith("test_")), len(parts) - 1)
        nodeid = "/".join(parts[: module_end + 1]) + ".py"
        for cls in parts[module_end + 1 :]:
            nodeid += "::" + cls
        nodeid += "::" + case.get("name", "?")
        state, text = "PASSED", ""
        for child in case:
            if child.tag in ("failure", "error"):
                state = "FAILED"
                text = (child.get("message") or "").splitlines()[0][:160] if child.get("message") else ""
            elif child.tag == "skipped":
                state = "SKIPPED"
                text = (child.get("message") or "")[:160]
        out[nodeid] = (state, float(case.get("time", 0.0)), text)
    return out


def excluded_entry(test, exclusions):
    """The exclusion entry matching a test id (exact, or a prefix ending at `::` or `[`)."""
    if test in exclusions:
        entry = exclusions[test]
        return None if entry[0] == "quick" else entry
    for key, entry in exclusions.items():
        if entry[0] == "subtests" and test.startswith(key + "["):
            return None  # a chosen subtest: it must pass
        if entry[0] != "quick" and (test.startswith(key + "::") or test.startswith(key + "[")):
            return entry
    return None


def check(suite, exclusions, results):
    rows, unexpected, now_passing = [], [], []
    for test in sorted(results):
        state, secs, text = results[test]
        entry = excluded_entry(test, exclusions)
        if entry and state == "PASSED":
            now_passing.append((test, entry[0]))
        if entry is None and state not in ("PASSED", "SKIPPED"):
            unexpected.append((test, state, text))
        rows.append((test, state, secs, (f"[{entry[0]}] " if entry else "") + text))
    width = max((len(r[0]) for r in rows), default=10)
    print(f"== {suite}: results")
    for test, state, secs, note in rows:
        print(f"  {test:<{width}}  {state:<11} {secs:8.1f}s  {note}")
    ran = [r for r in rows if r[1] not in ("SKIPPED", "NOT_STARTED")]
    passed = [r for r in rows if r[1] == "PASSED"]
    print(
        f"== {suite}: {len(passed)} passed, {len(ran) - len(passed)} failed"
        f" ({len(unexpected)} unexpected), {len(rows) - len(ran)} skipped by the suite,"
        f" {len(exclusions)} excluded by the list"
    )
    for test, kind in now_passing:
        print(f"  NOW PASSES (excluded as {kind}; remove it from the list): {test}")
    for test, state, text in unexpected:
        print(f"  UNEXPECTED {state}: {test} {text}")
    if not ran:
        print(f"== {suite}: no test ran: the run is broken")
        return 1
    return 1 if unexpected else 0


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    mode, exclude_path = argv[1], argv[2]
    exclusions = read_exclusions(exclude_path)
    if mode == "excluded":
        kinds = [argv[i + 1] for i, a in enumerate(argv) if a == "--kind" and i + 1 < len(argv)]
        for test, (kind, _) in exclusions.items():
            if not kinds or kind in kinds:
                print(test)
        return 0
    if mode == "subtests":
        for test, (kind, reason) in exclusions.items():
            if kind == "subtests":
                for subtest in reason.split()[0].split(","):
                    print(test[:4], subtest)
        return 0
    if mode == "numbers":
        test_c, scenario = argv[3], argv[4]
        kinds = [argv[i + 1] for i, a in enumerate(argv) if a == "--kind" and i + 1 < len(argv)]
        for number in librdkafka_numbers(test_c, exclusions, scenario, kinds):
            print(number)
        return 0
    if len(argv) < 4:
        sys.exit(__doc__)
    if mode == "librdkafka":
        return check("librdkafka", exclusions, librdkafka_merged(argv[3:]))
    if mode == "pytest":
        return check("kafka-python", exclusions, pytest_results(argv[3]))
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
