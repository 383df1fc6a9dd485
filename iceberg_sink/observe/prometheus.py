"""Serve a sink's metrics to Prometheus (``IcebergSinkBuilder.prometheus(port=...)``).

The names follow Flink's Prometheus reporter for Flink's Iceberg sink: ``iceberg_sink_`` + the Flink
group + ``_`` + the Flink metric name, e.g. ``iceberg_sink_IcebergFilesCommitter_committedDataFilesCount``
(Flink: ``flink_taskmanager_job_task_operator_IcebergFilesCommitter_committedDataFilesCount``).
Like Flink's reporter, counters and gauges are exported as Prometheus gauges and histograms as
summaries with quantile labels. Every sample carries the labels ``table`` and ``job``; maintenance
metrics also ``task_name``. The values are read from the sink at each scrape, so a scrape shows
exactly what ``sink.metrics().flink()`` returns at that moment (a routed sink's carry
``table="routed"``: they sum every table).

Per table, ``iceberg_sink_table_*`` (:func:`table_families`): each routed table's commits, records,
pending checkpoints and seconds since its last commit, so one stuck table among many is visible.
The series stay bounded: the ``max_tables`` most active tables (most committed records) by name,
and one ``table="other"`` series for the rest (counts summed, the largest commit age, so a stuck
table outside the top still raises it).

The endpoint binds 127.0.0.1 unless told otherwise (``addr="0.0.0.0"`` serves every interface).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import attrs

from iceberg_sink.errors import InvalidSinkConfigError
from iceberg_sink.observe.metrics import QUANTILES, HistogramStatistics, MetricsSnapshot, TableActivity

PREFIX = "iceberg_sink"
DEFAULT_ADDR = "127.0.0.1"
"""Loopback only: metrics name tables and jobs, so serving every interface is an explicit choice."""
DEFAULT_MAX_TABLES = 20
"""Tables with their own per-table series; the rest share ``table="other"``."""
OTHER_TABLES = "other"
"""The ``table`` label of the tables beyond ``max_tables`` (no table is named so: names have a namespace)."""

try:
    from prometheus_client.core import GaugeMetricFamily, Metric, SummaryMetricFamily
    from prometheus_client.registry import Collector, CollectorRegistry
    from prometheus_client.samples import Sample
except ImportError:  # pragma: no cover - exercised only without the extra
    _MISSING = True
else:
    _MISSING = False


def require_prometheus_client() -> None:
    """Raise a clear error when prometheus-client is not installed."""
    if _MISSING:
        raise InvalidSinkConfigError(
            "prometheus(): the prometheus-client package is not installed; install the metrics extra: "
            "pip install 'iceberg-sink[metrics]'"
        )


@attrs.frozen
class PrometheusConfig:
    """Where to serve the metrics.

    Attributes:
        port: TCP port; 0 picks a free one (``IcebergSink.prometheus_port`` tells which).
        addr: address to bind: the loopback interface by default; ``"0.0.0.0"`` (or a host's
            address) lets another machine's Prometheus scrape it.
        job: value of the ``job`` label (default: the table name).
        max_tables: per-table series: the most active tables that get their own, the rest share
            ``table="other"``.
    """

    port: int = 0
    addr: str = DEFAULT_ADDR
    job: str | None = None
    max_tables: int = DEFAULT_MAX_TABLES


def table_families(tables: tuple[TableActivity, ...], job: str, max_tables: int) -> list[Any]:
    """The ``iceberg_sink_table_*`` families: the ``max_tables`` most active tables (most committed
    records, then most commits, then by name) one series each, the others one ``table="other"``
    series (counts summed, the oldest last commit), so series stay bounded however many tables."""
    ranked = sorted(tables, key=lambda t: (-t.committed_records, -t.commits, t.table))
    shown: list[tuple[str, list[TableActivity]]] = [(t.table, [t]) for t in ranked[:max_tables]]
    if len(ranked) > max_tables:
        shown.append((OTHER_TABLES, ranked[max_tables:]))
    families = []
    for name, help_text, value in _TABLE_METRICS:
        family = GaugeMetricFamily(f"{PREFIX}_table_{name}", help_text, labels=["table", "job"])
        for label, group in shown:
            family.add_metric([label, job], float(value(group)))
        families.append(family)
    return families


_TABLE_METRICS: tuple[tuple[str, str, Callable[[list[TableActivity]], float]], ...] = (
    ("commits", "snapshots committed to the table", lambda g: sum(t.commits for t in g)),
    ("committedRecords", "data records committed", lambda g: sum(t.committed_records for t in g)),
    ("committedDataFiles", "data files committed", lambda g: sum(t.committed_data_files for t in g)),
    ("committedDeleteFiles", "delete files committed", lambda g: sum(t.committed_delete_files for t in g)),
    ("pendingCheckpoints", "checkpoints written, not yet committed", lambda g: sum(t.pending_checkpoints for t in g)),
    (
        "deferredCommits",
        "commits deferred while the catalog was unreachable",
        lambda g: sum(t.deferred_commits for t in g),
    ),
    (
        "catalogLockedCommits",
        "commits deferred because another process held the SQLite catalog file locked",
        lambda g: sum(t.catalog_locked_commits for t in g),
    ),
    (
        "elapsedSecondsSinceLastSuccessfulCommit",
        "seconds since the table's last commit (other: the oldest)",
        lambda g: max(t.seconds_since_last_commit for t in g),
    ),
    ("tables", "tables in the series (1, or how many share 'other')", len),
)


def metric_families(snapshot: MetricsSnapshot, table: str, job: str) -> list[Any]:
    """The Prometheus metric families of one metrics snapshot."""
    families: list[Any] = []
    flink = snapshot.flink()
    groups: list[tuple[str, dict[str, Any], dict[str, str]]] = [
        ("IcebergStreamWriter", flink["IcebergStreamWriter"], {}),
        ("IcebergFilesCommitter", flink["IcebergFilesCommitter"], {}),
    ]
    groups += [("maintenance", values, {"task_name": task}) for task, values in flink["maintenance"].items()]
    by_name: dict[str, Any] = {}
    for group, values, extra in groups:
        labels = {"table": table, "job": job, **extra}
        for name, value in values.items():
            full = f"{PREFIX}_{group}_{name}"
            if isinstance(value, HistogramStatistics):
                by_name.setdefault(full, _summary(full, name))
                _add_histogram(by_name[full], labels, value)
            else:
                if full not in by_name:
                    by_name[full] = GaugeMetricFamily(full, f"Flink's {group} {name}", labels=list(labels))
                by_name[full].add_metric(list(labels.values()), float(value))
    families.extend(by_name.values())
    by_source = flink["deadLetterRecordsBySourceTable"]
    if by_source:
        name = f"{PREFIX}_IcebergStreamWriter_deadLetterRecordsBySourceTable"
        family = GaugeMetricFamily(
            name, "Rows written to the dead-letter table, per source table", labels=["table", "job", "source_table"]
        )
        for source, count in _bounded(by_source):
            family.add_metric([table, job, source], float(count))
        families.append(family)
    return families


#: Series per source table at most; the rest are summed under source_table="other".
MAX_SOURCE_TABLE_SERIES = 100


def _bounded(counts: dict[str, int]) -> list[tuple[str, int]]:
    """The source tables with the most dead-lettered rows, the rest summed as ``other``."""
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    top = ranked[:MAX_SOURCE_TABLE_SERIES]
    rest = sum(n for _, n in ranked[MAX_SOURCE_TABLE_SERIES:])
    return top + ([("other", rest)] if rest else [])


def _summary(name: str, flink_name: str) -> Any:
    return SummaryMetricFamily(name, f"Flink's {flink_name} (file sizes in bytes)")


def _add_histogram(family: Any, labels: dict[str, str], value: HistogramStatistics) -> None:
    for q, v in value.quantiles or tuple((q, 0.0) for q in QUANTILES):
        family.samples.append(Sample(family.name, {**labels, "quantile": str(q)}, float(v)))
    family.samples.append(Sample(family.name + "_count", labels, float(value.count)))
    family.samples.append(Sample(family.name + "_sum", labels, float(value.total)))


class SinkCollector:
    """A Prometheus collector reading a sink's metrics at scrape time."""

    def __init__(
        self, snapshot: Callable[[], MetricsSnapshot], table: str, job: str, max_tables: int = DEFAULT_MAX_TABLES
    ) -> None:
        self._snapshot = snapshot
        self._table = table
        self._job = job
        self._max_tables = max_tables

    def collect(self) -> Iterator[Metric]:
        snapshot = self._snapshot()
        yield from metric_families(snapshot, self._table, self._job)
        yield from table_families(snapshot.tables, self._job, self._max_tables)


class MetricsServer:
    """An HTTP endpoint serving one sink's metrics (``/metrics``, any path works)."""

    def __init__(self, config: PrometheusConfig, snapshot: Callable[[], MetricsSnapshot], table: str) -> None:
        require_prometheus_client()
        from prometheus_client import start_http_server

        self.registry = CollectorRegistry(auto_describe=False)
        collector: Collector = SinkCollector(  # type: ignore[assignment]
            snapshot, table, config.job or table, config.max_tables
        )
        self.registry.register(collector)
        try:
            self._server, self._thread = start_http_server(config.port, addr=config.addr, registry=self.registry)
        except OSError as e:
            raise InvalidSinkConfigError(
                f"prometheus(port={config.port}, addr={config.addr!r}): cannot serve metrics there: {e}"
            ) from e
        self.port: int = self._server.server_port
        self.addr = config.addr
        self._lock = threading.Lock()
        self._closed = False

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.addr in ("0.0.0.0", "") else self.addr
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
