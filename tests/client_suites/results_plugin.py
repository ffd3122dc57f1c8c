"""pytest plugin: one JSON line per test phase, written as the tests run.

Loaded by tests/client_suites/run.sh (`-p results_plugin`). Unlike JUnit XML,
which pytest writes only at the end, the file keeps every finished test when
a run is killed by its timeout; the test that was running shows as started
and never finished. Lines: {"id", "event": "start"} and {"id", "event":
"setup"|"call"|"teardown", "outcome", "message", "seconds",
"details"}; {"event": "finished"} when pytest ends by itself.

With CLIENT_SUITES_RESUME=1, tests the file already names are deselected:
run.sh resumes a run that was stopped (a hung test) after that test.
CLIENT_SUITES_TIMEOUTS ("TEST_ID=SECONDS ...") gives slow tests a longer
pytest-timeout than the run's --timeout.
"""

import json
import os

import pytest

_out = None


def _write(record):
    global _out
    if _out is None:
        _out = open(os.environ["CLIENT_SUITES_RESULTS"], "a", buffering=1, encoding="utf-8")
    _out.write(json.dumps(record) + "\n")


def _message(report):
    if report.passed:
        return ""
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2])  # (file, line, reason)
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return crash.message
    return str(report.longrepr).strip().splitlines()[-1] if report.longrepr else ""


def pytest_runtest_logstart(nodeid, location):
    _write({"id": nodeid, "event": "start"})


def pytest_runtest_logreport(report):
    _write({
        "id": report.nodeid,
        "event": report.when,
        "outcome": report.outcome,
        "message": _message(report),
        "seconds": round(report.duration, 3),
        # the traceback of a failure, for reading later (cut to its end)
        "details": report.longreprtext[-4000:] if report.failed else "",
    })


def pytest_collection_modifyitems(config, items):
    timeouts = dict(pair.rsplit("=", 1) for pair in os.environ.get("CLIENT_SUITES_TIMEOUTS", "").split())
    for item in items:
        if item.nodeid in timeouts:
            item.add_marker(pytest.mark.timeout(float(timeouts[item.nodeid])))
    path = os.environ["CLIENT_SUITES_RESULTS"]
    if os.environ.get("CLIENT_SUITES_RESUME") != "1" or not os.path.exists(path):
        return
    done = set()
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                done.add(json.loads(line).get("id"))
            except ValueError:  # a line cut by the kill of a run
                pass
    deselected = [item for item in items if item.nodeid in done]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if item.nodeid not in done]


def pytest_sessionfinish(session, exitstatus):
    _write({"event": "finished", "exitstatus": int(exitstatus)})
