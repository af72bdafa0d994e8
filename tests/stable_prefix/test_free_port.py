"""`free_port`: a stack takes its ports before any server binds, so a port must never be handed out twice."""

from __future__ import annotations

import socket

from stable_prefix import servers


def test_a_port_the_kernel_gives_again_is_not_handed_out_twice(monkeypatch):
    # The kernel may hand a just-released port out again: here it does, twice in a row.
    ports_the_kernel_gives = iter([41001, 41001, 41001, 41002])

    class ReusingSocket:
        def __init__(self, *args):
            self.port = None

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def bind(self, address):
            self.port = next(ports_the_kernel_gives)

        def getsockname(self):
            return (servers.LOOPBACK, self.port)

    monkeypatch.setattr(servers, "_handed_out", set())
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)  # one process's share: every port (these two fall in one block)
    monkeypatch.setattr(servers.socket, "socket", ReusingSocket)
    assert [servers.free_port(), servers.free_port()] == [41001, 41002]


def test_every_port_handed_out_is_free_and_distinct():
    ports = [servers.free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    for port in ports[:5]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((servers.LOOPBACK, port))


def test_parallel_test_workers_hand_out_disjoint_ports(monkeypatch):
    # Of two pytest-xdist workers, the first takes ports 0-15, 32-47, ... and the second 16-31, 48-63, ...
    monkeypatch.setattr(servers, "_handed_out", set())
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    for worker, remainder in (("gw0", 0), ("gw1", 1)):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        assert {servers.free_port() // 16 % 2 for _ in range(20)} == {remainder}
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    assert {servers.free_port() // 16 % 2 for _ in range(60)} == {0, 1}  # one process: any port
