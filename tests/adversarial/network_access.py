"""Connects to a TCP server listening on the host's loopback (the test fills in its port).
screen: reject
runtime: runtime_error
"""
import socket

PORT = 0  # the test replaces this with the port of a server it runs

s = socket.create_connection(("127.0.0.1", PORT), timeout=2)
s.sendall(b"escaped")
s.close()


class ModelNew:
    pass
