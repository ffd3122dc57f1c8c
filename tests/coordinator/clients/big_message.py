"""Clients that announce a large message and send little of it make the
coordinator hold only what they sent (not room for all they announced).

Usage: big_message.py COORDINATOR_PORT COORDINATOR_PID DATABASE
Prints how many MiB the coordinator's address space grew.
"""

import struct
import sys
import time

from rawclient import login

port, pid, database = int(sys.argv[1]), sys.argv[2], sys.argv[3]


def vm_kib():
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1])
    return 0


clients = [login(port, database) for _ in range(20)]
if any(isinstance(c, str) for c in clients):
    raise SystemExit("a login was refused")
before = vm_kib()
for sock in clients:
    sock.sendall(b"Q" + struct.pack("!i", 60 << 20) + b"SELECT 1; ")
time.sleep(1)
print((vm_kib() - before) // 1024)
