"""How busy the machine was with *other* work while a benchmark ran (Linux ``/proc``).

A background thread samples ``/proc/<pid>/stat`` of every process about once a second and adds up
the CPU time of processes that are not this process or one of its descendants (the benchmark's
drivers, their JVMs and Python workers are descendants). On a 2-core machine a concurrent test run
or build easily doubles a batch's latency, so the benchmark reports this foreign CPU time per batch
and can wait for a quiet machine before each system starts.

A process that starts and ends between two samples is missed, and a foreign process's CPU time
before its first sample is counted in full at that sample (it started within the interval, or the
monitor just started); both are small at a 1 s interval.
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _read_processes(reaped_children: bool = False) -> dict[int, tuple[int, float]]:
    """pid -> (ppid, CPU seconds used so far) for every process that can be read; with
    ``reaped_children``, each process's count includes its children that have exited and been
    waited for (``cutime``/``cstime``)."""
    last = 15 if reaped_children else 13
    out: dict[int, tuple[int, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ... utime stime": comm may contain spaces and parentheses.
        fields = text[text.rfind(")") + 2 :].split()
        try:
            out[int(entry.name)] = (int(fields[1]), sum(int(f) for f in fields[11:last]) / _TICKS)
        except (IndexError, ValueError):
            continue
    return out


def _descendants(root: int, processes: dict[int, tuple[int, float]]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in processes.items():
        children.setdefault(ppid, []).append(pid)
    found = {root}
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


class ForeignCpuMonitor:
    """Cumulative CPU seconds of processes outside this process tree, sampled every ``interval``."""

    def __init__(self, interval: float = 1.0) -> None:
        self.interval = interval
        self.available = Path("/proc/self/stat").exists()
        self._roots = {os.getpid()}
        self._ever_ours: set[int] = set()
        self._times: list[float] = []
        self._totals: list[float] = []
        self._total = 0.0
        self._last: dict[int, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        processes = _read_processes()
        with self._lock:
            roots = set(self._roots)
        # A process once ours stays ours: a JVM whose Python driver exited first is reparented to
        # init, and would otherwise count its whole lifetime's CPU as foreign at its next sample.
        ours = set().union(*(_descendants(root, processes) for root in roots)) | self._ever_ours
        self._ever_ours = ours & set(processes)
        now = time.time()
        first = not self._times
        current: dict[int, float] = {}
        added = 0.0
        for pid, (_, cpu) in processes.items():
            if pid in ours:
                continue
            current[pid] = cpu
            if not first:
                added += max(0.0, cpu - self._last.get(pid, 0.0))
        with self._lock:
            self._last = current
            self._total += added
            self._times.append(now)
            self._totals.append(self._total)

    def adopt(self, pid: int) -> None:
        """Count ``pid`` and its descendants as ours: a process this benchmark started that is not
        its descendant (PyFlink's JVM, reparented when the launcher between them exits)."""
        with self._lock:
            self._roots.add(pid)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def start(self) -> ForeignCpuMonitor:
        if self.available and self._thread is None:
            self._sample()
            self._thread = threading.Thread(target=self._run, name="foreign-cpu-monitor", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def total_at(self, when: float) -> float:
        """Foreign CPU seconds accumulated by wall-clock time ``when`` (linear between samples)."""
        with self._lock:
            times, totals = list(self._times), list(self._totals)
        if not times:
            return 0.0
        i = bisect.bisect_left(times, when)
        if i == 0:
            return totals[0]
        if i >= len(times):
            return totals[-1]
        t0, t1 = times[i - 1], times[i]
        return totals[i - 1] + (totals[i] - totals[i - 1]) * (when - t0) / (t1 - t0)

    def between(self, start: float, end: float) -> float | None:
        """Foreign CPU seconds between two wall-clock times; None without /proc."""
        if not self.available:
            return None
        return max(0.0, self.total_at(end) - self.total_at(start))

    def wait_until_quiet(self, threshold: float, quiet_seconds: float, max_wait: float) -> float:
        """Block until other processes used under ``threshold`` cores over the last ``quiet_seconds``
        (samples from before the call count), or ``max_wait`` seconds passed. Returns the seconds waited."""
        if not self.available or max_wait <= 0:
            return 0.0
        started = time.time()
        while True:
            now = time.time()
            window_start = now - quiet_seconds
            with self._lock:
                covered = bool(self._times) and self._times[0] <= window_start
            if covered and (self.between(window_start, now) or 0.0) / quiet_seconds < threshold:
                return now - started
            if now - started >= max_wait:
                return now - started
            time.sleep(self.interval / 2)


def quiet_gate(spec: dict[str, Any]) -> tuple[ForeignCpuMonitor, Callable[[], float]]:
    """A started monitor and a function that waits for a quiet machine as ``spec["quiet"]`` says
    (``threshold`` cores, ``seconds`` window, ``max_wait`` seconds; no waiting without it)."""
    monitor = ForeignCpuMonitor(interval=0.5).start()
    quiet = spec.get("quiet") or {}

    def wait() -> float:
        if not quiet or quiet.get("max_wait", 0) <= 0:
            return 0.0
        return monitor.wait_until_quiet(quiet["threshold"], quiet["seconds"], quiet["max_wait"])

    return monitor, wait


def tree_cpu_seconds(root: int | None = None, also: tuple[int, ...] = (), without: int | None = None) -> float | None:
    """CPU seconds used so far by ``root`` (default: this process) and all its descendants, read now;
    ``also``: more roots whose trees count too (each process once); ``without``: a process whose tree
    does not count (a server the benchmark started, measured apart).

    For every live process of the tree: its own user and system time plus those of its children that
    have exited and been waited for (``cutime``/``cstime``), so a Python worker that ended inside the
    tree still counts. Exact at the moment of the call (unlike the sampled monitor); None without /proc.
    """
    if not Path("/proc/self/stat").exists():
        return None
    root = os.getpid() if root is None else root
    totals = _read_processes(reaped_children=True)
    pids = set().union(*(_descendants(r, totals) for r in (root, *also)))
    if without is not None:
        pids -= _descendants(without, totals)
    return sum(totals[pid][1] for pid in pids if pid in totals)
