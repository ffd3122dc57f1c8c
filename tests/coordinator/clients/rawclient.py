"""A bare protocol-v3 client over a socket, for tests that need connections
psycopg would not make: logged in and then silent, sending half a message,
dropping the connection mid-answer. Trust (or peer) logins only."""

import socket
import struct


def until(sock, ending):
    """Bytes read until they end with `ending` (and whether they did)."""
    seen = b""
    while not seen.endswith(ending):
        chunk = sock.recv(65536)
        if not chunk:
            return seen, False
        seen += chunk
    return seen, True


READY = b"Z\0\0\0\x05I"


def login(port, database, user="postgres"):
    """A logged-in socket, or the text of what the server refused it with."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    body = (struct.pack("!i", 196608) + b"user\0" + user.encode() + b"\0database\0"
            + database.encode() + b"\0\0")
    sock.sendall(struct.pack("!i", len(body) + 4) + body)
    seen, ready = until(sock, READY)
    if ready:
        return sock
    sock.close()
    return seen.decode("utf-8", "replace")


def query_message(sql):
    text = sql.encode() + b"\0"
    return b"Q" + struct.pack("!i", len(text) + 4) + text


def query(sock, sql):
    """Runs `sql`; True when it completed as SELECT 1 row."""
    sock.sendall(query_message(sql))
    seen, ready = until(sock, READY)
    return ready and b"C\0\0\0\rSELECT 1\0" in seen
