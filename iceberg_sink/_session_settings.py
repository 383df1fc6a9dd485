"""Spark settings the sink sets on a session for a while, and puts back as the session had them.

A session's SQL settings are shared by every thread that uses it: two bounded writes on one session
from two threads can hold settings of their own at once (a small batch's, job/codegen.py; an
unbounded Arrow batch, writer/arrow_batches.py). Each holder used to save the values it found and
restore them when done. With two holders, the second one found the first one's values and restored
those when it was done. If it finished last, the session kept the sink's settings for good.

Here every holder of a key on one session (the JVM's session, by identity) shares one record: the
first to take the key saves the session's own value and sets the sink's, later holders only count
themselves in, and the last to let go puts the saved value back (unset when the session had none).
A holder that finds a key held runs with the value already set: the same values, only the speed
differs (the settings are all about how Spark evaluates, never what).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import attrs
from py4j.java_gateway import JavaClass
from pyspark.sql import SparkSession


@attrs.define
class _Record:
    holders: int
    own: str | None  # the session's own value; None: not set


_lock = threading.Lock()
_HELD: dict[tuple[int, str], _Record] = {}  # (session identity, key) -> its record


def session_identity(spark: SparkSession) -> int:
    """The JVM session's identity (a stream's clone is a session of its own). ``System`` named in
    full (py4j's JavaClass): ``jvm.java.lang.System`` resolves ``java`` and ``java.lang`` through
    failed class lookups that walk every jar of the class path (1.3 ms), and a small batch asks
    this every micro-batch."""
    client = spark.sparkContext._gateway._gateway_client  # type: ignore[union-attr]
    return int(JavaClass("java.lang.System", client).identityHashCode(spark._jsparkSession))


class Held:
    """Settings one holder took on one session (:func:`take`); :meth:`release` lets go of them."""

    def __init__(self, spark: SparkSession, identity: int, keys: tuple[str, ...]) -> None:
        self._spark = spark
        self._identity = identity
        self.keys = keys

    def release(self) -> None:
        conf = self._spark.conf
        with _lock:
            for key in self.keys:
                record = _HELD[(self._identity, key)]
                record.holders -= 1
                if record.holders == 0:
                    del _HELD[(self._identity, key)]
                    if record.own is None:
                        conf.unset(key)
                    else:
                        conf.set(key, record.own)
        self.keys = ()


def take(spark: SparkSession, settings: Mapping[str, str], identity: int | None = None) -> Held:
    """Hold ``settings`` on ``spark``'s session until the result's :meth:`Held.release` (module
    docstring: a key another holder already holds keeps that holder's value)."""
    identity = session_identity(spark) if identity is None else identity
    conf = spark.conf
    with _lock:
        for key, value in settings.items():
            record = _HELD.get((identity, key))
            if record is None:
                own = conf.get(key, None)
                _HELD[(identity, key)] = _Record(holders=1, own=None if own is None else str(own))
                conf.set(key, value)
            else:
                record.holders += 1
    return Held(spark, identity, tuple(settings))


@contextmanager
def holding(spark: SparkSession, settings: Mapping[str, str]) -> Iterator[None]:
    """Within the block, ``spark``'s session holds ``settings`` (:func:`take`)."""
    held = take(spark, settings)
    try:
        yield
    finally:
        held.release()
