"""At a low open files limit the coordinator refuses the clients that do
not fit, cleanly (53300), and serves the others.

Usage: open_files.py COORDINATOR_PORT DATABASE CLIENTS
"""

import socket
import sys
import time

from rawclient import login, query
from tap import Checks

port, database, count = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
check = Checks("open files")


results = [login(port, database) for _ in range(count)]
admitted = [r for r in results if isinstance(r, socket.socket)]
refused = [r for r in results if isinstance(r, str)]
check(f"{count} clients at a limit of 256 open files: {len(admitted)} served, {len(refused)} refused with 53300",
      admitted and refused and all("53300" in r and "too many clients" in r for r in refused),
      f"refusals: {sorted(set(refused))[:2]}")
check("the clients it took are served", all(query(s, "SELECT 1") for s in (admitted[0], admitted[-1])))
for s in admitted:
    s.close()
time.sleep(0.5)
started = time.monotonic()
after = login(port, database)
check("once they left, a new client is served within a second",
      isinstance(after, socket.socket) and query(after, "SELECT 1") and time.monotonic() - started < 1)
sys.exit(1 if check.failures else 0)
