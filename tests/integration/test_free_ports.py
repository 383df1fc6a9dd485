"""Ports picked for a component that listens on several (scripts/pipeline_components.py
``free_ports``): a Kafka broker's listener and controller, a Spark master's and its UI. Picked one
after the other, two could be the same port (the system may hand out a port just released): the
guide's broker once failed to start with both listeners on one port. The broker's jars come from
Maven Central on first use (scripts/pipeline_components.py)."""

from __future__ import annotations

import socket

from tests import scripts


def test_ports_picked_together_are_distinct_free_and_avoid_the_given_ones() -> None:
    components = scripts.load("pipeline_components.py")
    for _ in range(50):
        first, second = components.free_ports(2)
        assert first != second
        assert first not in components.free_ports(3, avoid=(first,))
    for port in components.free_ports(3):
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free once returned: nothing holds it


def test_a_broker_never_gets_one_port_twice(tmp_path: object) -> None:
    components = scripts.load("pipeline_components.py")
    for i in range(20):
        broker = components.KafkaBroker(tmp_path / f"b{i}")  # type: ignore[operator]
        assert broker.port != broker.controller_port
    given = components.free_port()
    broker = components.KafkaBroker(tmp_path / "given", port=given)  # type: ignore[operator]
    assert broker.port == given and broker.controller_port != given
