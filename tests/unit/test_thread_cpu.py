"""benchmarks.thread_cpu's summary: CPU seconds per process kind and JVM thread kind over a stream.

Nothing here is timed: it checks the arithmetic over a hand-written samples file.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks import thread_cpu


def _line(at: float, key: str, ticks: int, kind: str, name: str) -> str:
    return f"{at:.2f}\t{key}\t{ticks}\t{kind}\t{name}\n"


def test_a_streams_cpu_is_split_by_process_and_thread_kind_inside_its_intervals(tmp_path: Path) -> None:
    samples = tmp_path / "samples.tsv"
    tick = thread_cpu.TICKS
    lines = []
    for second in range(0, 31):
        lines.append(_line(100 + second, "P1", 2 * tick * second, "spark", "java ... SparkSubmit"))
        lines.append(_line(100 + second, "T11", tick * second, "spark-thread", "C2 CompilerThre"))
        lines.append(_line(100 + second, "T12", tick * second // 2, "spark-thread", "Executor task l"))
        lines.append(_line(100 + second, "T13", tick * second // 2, "spark-thread", "Executor task l"))
        lines.append(_line(100 + second, "P2", tick * second // 4, "kafka", "java ... kafka"))
    samples.write_text("".join(lines))
    result = {
        "systems": {
            "s": {
                "batch_intervals": [[95.0, 100.0], [100.0, 110.0], [110.0, 120.0]],
                "micro_batch_changes": [1, 10, 10],
            }
        }
    }
    out = thread_cpu.summarize(samples, result, "s", window=10.0, skip=1)
    assert out["seconds"] == 20.0 and out["entries"] == 2 and out["changes"] == 20
    # 20 s: the JVM 2 cores' worth, the broker a quarter of one; both task threads fold into one kind,
    # and so would C1 and C2 (digits folded).
    assert out["processes"] == {"spark": 40.0, "kafka": 5.0}
    assert out["threads"] == {"spark: C# CompilerThre": 20.0, "spark: Executor task l": 20.0}
    assert out["cpu_seconds"] == 45.0 and out["cores_busy"] == 2.25
    assert out["cpu_seconds_per_million_changes"] == 45.0 / 20 * 1e6
    assert [w["from_seconds"] for w in out["windows"]] == [0.0, 10.0]
    assert out["windows"][1]["processes"]["spark"] == 20.0
