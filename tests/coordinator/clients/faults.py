#!/usr/bin/env python3
"""Bad input and faults at the protocol level, with raw sockets: each must
end with an error or a closed connection for that client only, while other
clients keep working. Usage: faults.py PORT DATABASE"""
import socket
import struct
import sys
import time

import psycopg
from tap import Checks

port, database = int(sys.argv[1]), sys.argv[2]
check = Checks("faults")


def startup(sock):
    params = b"user\0postgres\0database\0" + database.encode() + b"\0\0"
    sock.sendall(struct.pack("!ii", 8 + len(params), 196608) + params)
    return read_until_ready(sock)


def message(tag, body):
    return tag + struct.pack("!i", 4 + len(body)) + body


def read_messages(sock, timeout=5):
    """Messages until ReadyForQuery or the connection closes."""
    sock.settimeout(timeout)
    data = b""
    messages = []
    while True:
        while len(data) >= 5:
            length = struct.unpack("!i", data[1:5])[0]
            if len(data) < 1 + length:
                break
            messages.append((data[:1], data[5:1 + length]))
            data = data[1 + length:]
            if messages[-1][0] == b"Z":
                return messages, False
        try:
            chunk = sock.recv(65536)
        except (socket.timeout, ConnectionResetError):
            return messages, True
        if not chunk:
            return messages, True
        data += chunk


def receive_until(sock, marker, timeout=5):
    """Raw bytes until `marker` has arrived (or the connection closed)."""
    sock.settimeout(timeout)
    data = b""
    while marker not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def read_until_ready(sock):
    messages, _ = read_messages(sock)
    return messages


def connect():
    sock = socket.create_connection(("127.0.0.1", port))
    startup(sock)
    return sock


def healthy():
    with psycopg.connect(host="127.0.0.1", port=port, dbname=database, user="postgres",
                         autocommit=True) as conn:
        return conn.execute("SELECT owner FROM accounts WHERE id = 42").fetchone() == ("owner 42",)


def error_code(messages):
    for tag, body in messages:
        if tag == b"E":
            for field in body.split(b"\0"):
                if field[:1] == b"C":
                    return field[1:].decode()
    return None


# A length that is too small, and one far beyond the limit.
sock = connect()
sock.sendall(b"Q" + struct.pack("!i", 2))
_, closed = read_messages(sock)
check("bad message length closes the connection", closed)
sock = connect()
sock.sendall(b"Q" + struct.pack("!i", 0x7FFFFFF0))
_, closed = read_messages(sock)
check("oversized message closes the connection", closed)
# An unknown message type and a truncated Bind.
sock = connect()
sock.sendall(message(b"z", b"junk"))
_, closed = read_messages(sock)
check("unknown message type closes the connection", closed)
sock = connect()
sock.sendall(message(b"B", b"\0\0\0\x01\0") + message(b"S", b""))
_, closed = read_messages(sock)
check("malformed Bind closes the connection", closed)
# Garbage instead of a startup packet.
sock = socket.create_connection(("127.0.0.1", port))
sock.sendall(b"\0\0\0\x08\x12\x34\x56\x78")
_, closed = read_messages(sock)
check("unknown protocol version is refused", closed)
# Unknown statement and portal names: an error, the connection stays.
sock = connect()
sock.sendall(message(b"B", b"\0nosuch\0\0\0\0\0\0\0") + message(b"S", b""))
messages, closed = read_messages(sock)
check("Bind of an unknown statement: 26000", error_code(messages) == "26000" and not closed)
sock.sendall(message(b"E", b"nosuchportal\0\0\0\0\0") + message(b"S", b""))
messages, closed = read_messages(sock)
check("Execute of an unknown portal: 34000", error_code(messages) == "34000" and not closed)
sock.sendall(message(b"Q", b"SELECT 1\0"))
messages, closed = read_messages(sock)
check("connection usable after those errors", any(t == b"D" for t, _ in messages))
sock.close()
# Flush: answers come without waiting for Sync; then Sync ends the batch.
sock = connect()
sock.sendall(message(b"P", b"\0SELECT owner FROM accounts WHERE id = $1\0\0\0")
             + message(b"B", b"\0\0\0\0\0\x01\0\0\0\x0242\0\0")
             + message(b"E", b"\0\0\0\0\0") + message(b"H", b""))
data = receive_until(sock, b"C\0\0\0\x0dSELECT 1\0")
flushed = data.startswith(b"1\0\0\0\x04" + b"2\0\0\0\x04") and b"owner 42" in data and b"Z" not in data[-6:]
sock.sendall(message(b"S", b""))
messages, closed = read_messages(sock)
check("Flush answers before Sync, Sync then ends the batch",
      flushed and [t for t, _ in messages] == [b"Z"] and not closed)
sock.close()
def extended(sql, *values):
    """Parse/Bind/Execute of an unnamed statement with text parameters."""
    params = b"".join(struct.pack("!i", len(v)) + v for v in values)
    return (message(b"P", b"\0" + sql.encode() + b"\0\0\0")
            + message(b"B", b"\0\0\0\0" + struct.pack("!h", len(values)) + params + b"\0\0")
            + message(b"E", b"\0\0\0\0\0"))


def tags(messages):
    return [t for t, _ in messages]


# A failed transaction ended with ROLLBACK over the extended protocol.
sock = connect()
sock.sendall(message(b"Q", b"BEGIN\0"))
read_messages(sock)
sock.sendall(extended("INSERT INTO accounts (id, owner, balance) VALUES ($1, 'dup', 0)", b"42")
             + message(b"S", b""))
messages, _ = read_messages(sock)
failed = error_code(messages) == "23505" and messages[-1] == (b"Z", b"E")
sock.sendall(extended("ROLLBACK") + message(b"S", b""))
messages, closed = read_messages(sock)
check("extended ROLLBACK ends a failed transaction",
      failed and error_code(messages) is None and messages[-1] == (b"Z", b"I") and not closed)
sock.close()
# An error before a Flush: the server skips to Sync; so must the coordinator.
sock = connect()
sock.sendall(extended("SELECT 1 / 0") + message(b"H", b""))
time.sleep(0.3)
sock.sendall(extended("SELECT 1") + message(b"S", b""))
messages, closed = read_messages(sock)
check("error before Flush, then a batch with Sync: one error, one ReadyForQuery",
      error_code(messages) == "22012" and tags(messages).count(b"Z") == 1 and b"D" not in tags(messages)
      and not closed)
sock.sendall(message(b"Q", b"SELECT owner FROM accounts WHERE id = 42\0"))
messages, closed = read_messages(sock)
check("connection usable after that", b"D" in tags(messages) and not closed)
sock.close()
# Close of a statement in the batch that binds it: no crash.
sock = connect()
sock.sendall(message(b"P", b"s1\0SELECT 1\0\0\0") + message(b"S", b""))
read_messages(sock)
sock.sendall(message(b"C", b"Ss1\0") + message(b"B", b"\0s1\0\0\0\0\0\0\0")
             + message(b"E", b"\0\0\0\0\0") + message(b"S", b""))
messages, closed = read_messages(sock)
sock.sendall(message(b"Q", b"SELECT 2\0"))
after, closed = read_messages(sock)
check("Close and Bind of one statement in a batch", b"D" in tags(after) and not closed)
sock.close()
# COPY FROM STDIN over the extended protocol.
sock = connect()
sock.sendall(extended("COPY accounts (id, owner, balance) FROM STDIN") + message(b"S", b""))
# ParseComplete, BindComplete, then CopyInResponse
data = receive_until(sock, b"2\0\0\0\x04G")
sock.sendall(message(b"d", b"6001\textended copy\t1\n") + message(b"c", b"") + message(b"S", b""))
messages, closed = read_messages(sock)
sock.sendall(message(b"Q", b"SELECT owner FROM accounts WHERE id = 6001\0"))
rows, _ = read_messages(sock)
check("extended-protocol COPY FROM STDIN",
      b"2\0\0\0\x04G" in data and error_code(messages) is None
      and b"extended copy" in b"".join(b for _, b in rows))
sock.close()
# A client that vanishes mid-query.
sock = connect()
sock.sendall(message(b"Q", b"SELECT pg_sleep(2)\0"))
time.sleep(0.2)
sock.close()
check("other clients unaffected by one that vanished mid-query", healthy())
# Many connections at once, some abandoned during startup.
socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]
for s in socks[:10]:
    s.sendall(b"\0\0")
for s in socks:
    s.close()
check("half-open startups do not disturb service", healthy())
sys.exit(1 if check.failures else 0)
