"""Compare each suite's run straight against the metadata node with its run
through the coordinator.

    compare.py RESULTS_DIR EXPECTED_FILE SUITE...

Reads RESULTS_DIR/SUITE.direct.jsonl and SUITE.via.jsonl (written by
results_plugin.py) and SUITE.direct.exit / SUITE.via.exit (the run's exit
code and seconds). Every test that passed directly is one line: `ok - ` when
it passed through the coordinator too (or is listed in EXPECTED_FILE, with
its reason), `not ok - ` with what happened through the coordinator
otherwise (failed, errored, skipped, or never reported because the run hung
or died). Writes each such failure's traceback to RESULTS_DIR/SUITE.failures.txt.
Ends with `client suites: N passed, M failed`; exits 1 when M > 0.
"""

import json
import sys
from pathlib import Path


def outcomes(path):
    """test id -> (outcome, message, details); outcome is passed, failed,
    skipped or unfinished (started, never finished)."""
    phases = {}
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except ValueError:  # a line cut by the kill of a run
                continue
            if "id" in record:
                phases.setdefault(record["id"], []).append(record)
    result = {}
    for test, records in phases.items():
        done = [r for r in records if r["event"] != "start"]
        failed = [r for r in done if r["outcome"] == "failed"]
        skipped = [r for r in done if r["outcome"] == "skipped"]
        if failed:
            r = failed[0]
            kind = "failed" if r["event"] == "call" else f"error in {r['event']}"
            result[test] = ("failed", f"{kind}: {r['message']}", r.get("details", ""))
        elif skipped:
            result[test] = ("skipped", f"skipped: {skipped[0]['message']}", "")
        elif any(r["event"] == "call" for r in done) and any(r["event"] == "teardown" for r in done):
            result[test] = ("passed", "", "")
        else:
            result[test] = ("unfinished", "hung: started, never finished (stopped by a timeout)", "")
    return result


def run_summary(results_dir, suite, mode):
    path = results_dir / f"{suite}.{mode}.exit"
    code, seconds = (path.read_text().split() + ["?", "?"])[:2] if path.exists() else ("?", "?")
    return code, seconds


def load_expected(path):
    """'SUITE TEST_ID | reason' lines; # comments and blank lines ignored."""
    expected = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        test, sep, reason = line.partition(" | ")
        if not sep or not reason.strip():
            sys.exit(f"{path}:{number}: expected 'SUITE TEST_ID | reason'")
        if test.strip() in expected:
            sys.exit(f"{path}:{number}: {test.strip()} is listed twice")
        expected[test.strip()] = reason.strip()
    return expected


def main():
    results_dir, expected_file, suites = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
    expected = load_expected(expected_file)
    seen = set()
    passed = failed = 0
    for suite in suites:
        direct = outcomes(results_dir / f"{suite}.direct.jsonl")
        via = outcomes(results_dir / f"{suite}.via.jsonl")
        counts = {}
        for outcome, _, _ in direct.values():
            counts[outcome] = counts.get(outcome, 0) + 1
        code, seconds = run_summary(results_dir, suite, "direct")
        via_code, via_seconds = run_summary(results_dir, suite, "via")
        print(f"# {suite} directly: {counts.get('passed', 0)} passed, {counts.get('failed', 0)} failed,"
              f" {counts.get('skipped', 0)} skipped in {seconds} s (exit {code});"
              f" through the coordinator: {sum(1 for o in via.values() if o[0] == 'passed')} passed"
              f" in {via_seconds} s (exit {via_code})")
        if counts.get("passed", 0) == 0 or code == "124":
            print(f"not ok - {suite}: the direct run {'timed out' if code == '124' else 'passed no test'}")
            failed += 1
        missing = "not reported: the run through the coordinator " + (
            f"was killed by its timeout after {via_seconds} s" if via_code == "124"
            else f"ended (exit {via_code}) before it")
        lines, failures = [], []
        for test in sorted(t for t, o in direct.items() if o[0] == "passed"):
            name = f"{suite} {test}"
            seen.add(name)
            outcome, message, details = via.get(test, ("missing", missing, ""))
            if outcome == "passed":
                lines.append(f"ok - {name}")
                passed += 1
            elif name in expected:
                lines.append(f"ok - {name} # expected difference: {expected[name]}")
                passed += 1
            else:
                first_line = message.strip().splitlines()[0] if message.strip() else outcome
                failures.append(f"not ok - {name} # through the coordinator: {first_line}")
                failed += 1
                if details:
                    with (results_dir / f"{suite}.failures.txt").open("a", encoding="utf-8") as f:
                        f.write(f"===== {name}\n{details}\n\n")
        print("\n".join(lines + failures))
        for test in sorted(t for t in expected if t.startswith(f"{suite} ")):
            if test.split(" ", 1)[1] in via and via[test.split(" ", 1)[1]][0] == "passed":
                print(f"# note: {test} passed through the coordinator: remove it from {expected_file.name}")
    for test in sorted(set(expected) - seen):
        print(f"# note: {test} (in {expected_file.name}) did not pass directly")
    print(f"client suites: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
