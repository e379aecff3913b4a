#!/usr/bin/env python3
"""Abusive clients for tests/bench/abuse_bench.sh (loopback only).

  abuse_clients.py hold PORT COUNT SECONDS      open COUNT connections (non-blocking) and hold them SECONDS
  abuse_clients.py garbage PORT COUNT           COUNT connections, each sending 16 B to 4 KiB of random bytes
"""
import random
import socket
import sys
import time


def hold(port: int, count: int, seconds: float) -> None:
    keep = []
    for _ in range(count):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        keep.append(s)
    time.sleep(seconds)


def garbage(port: int, count: int) -> None:
    rnd = random.Random(port)
    for _ in range(count):  # malformed messages: ZeroMQ drops the peer, the fast path refuses the frame
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=2)
            s.sendall(bytes(rnd.getrandbits(8) for _ in range(rnd.randint(16, 4096))))
            s.close()
        except OSError:
            pass


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "hold":
        hold(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
    elif len(sys.argv) == 4 and sys.argv[1] == "garbage":
        garbage(int(sys.argv[2]), int(sys.argv[3]))
    else:
        sys.exit(__doc__)
