"""driver_java_options(): the driver JVM's later C2 compilation and class data sharing archive, with
this machine's real Java runtimes (Java 17: the archive written at exit under a name of its own and
checked before it is used; Java 19+: the JVM's own -XX:+AutoCreateSharedArchive)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from iceberg_sink import InvalidSinkConfigError, driver_java_options
from iceberg_sink._driver_jvm import (
    ENVIRONMENT,
    LATER_C2,
    archive_key,
    feature_version,
    names_class_sharing,
)


@pytest.fixture(autouse=True)
def _own_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # The test suite's JVMs share an archive through JAVA_TOOL_OPTIONS (scripts/test.sh): without it
    # here, so driver_java_options() chooses its own.
    for name in ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)


def _java(options: str, *extra: str) -> subprocess.CompletedProcess[str]:
    """``java <options> <extra> -version`` with the runtime driver_java_options() found."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else "java"
    return subprocess.run(
        [java, *options.split(), *extra, "-XX:-CreateCoredumpOnCrash", f"-XX:ErrorFile={os.devnull}", "-version"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _option(options: str, name: str) -> str | None:
    for option in options.split():
        if option.startswith(f"-XX:{name}="):
            return option.split("=", 1)[1]
    return None


def _age(path: Path, seconds: float = 600) -> None:
    past = time.time() - seconds
    os.utime(path, (past, past))


@pytest.mark.parametrize(
    ("report", "expected"),
    [
        ('openjdk version "17.0.15" 2025-04-15\nOpenJDK 64-Bit Server VM (mixed mode, sharing)', 17),
        ('openjdk version "25.0.3" 2025-10-21 LTS', 25),
        ('openjdk version "21" 2023-09-19', 21),
        ('java version "1.8.0_392"', 8),
        ('openjdk version "26-ea" 2026-03-17', 26),
        ("no version here", None),
    ],
)
def test_the_feature_version_of_a_java_version_report(report: str, expected: int | None) -> None:
    assert feature_version(report) == expected


def test_options_that_already_choose_an_archive_are_recognised() -> None:
    assert names_class_sharing("-Xmx2g -XX:SharedArchiveFile=/a.jsa")
    assert names_class_sharing("-Xshare:off")
    assert names_class_sharing("-XX:ArchiveClassesAtExit=/b.jsa")
    assert names_class_sharing("-XX:AOTCache=app.aot")
    assert not names_class_sharing("-Xmx2g -XX:+UseG1GC")


def test_the_archive_is_named_by_the_runtime_and_by_each_jar(tmp_path: Path) -> None:
    jar = tmp_path / "spark-core.jar"
    jar.write_bytes(b"x" * 10)
    report = 'openjdk version "17.0.15"'
    first = archive_key("/usr/bin/java", report, [jar])
    assert first.startswith("java17-")
    assert archive_key("/usr/bin/java", report, [jar]) == first
    assert archive_key("/usr/bin/java", 'openjdk version "17.0.16"', [jar]) != first
    jar.write_bytes(b"x" * 11)
    assert archive_key("/usr/bin/java", report, [jar]) != first


def test_java_17_writes_the_archive_under_a_name_of_its_own_then_uses_it(tmp_path: Path) -> None:
    options = driver_java_options(cache_dir=tmp_path)
    for flag in LATER_C2:
        assert flag in options.split()
    written = _option(options, "ArchiveClassesAtExit")
    assert written is not None and written.endswith(".partial"), options
    assert _option(options, "SharedArchiveFile") is None
    run = _java(options)
    assert run.returncode == 0, run.stderr
    partial = Path(written)
    assert partial.is_file() and partial.stat().st_size > 0

    # Still settling (a JVM may be writing it at exit): left alone, and this driver writes its own.
    again = driver_java_options(cache_dir=tmp_path)
    assert _option(again, "ArchiveClassesAtExit") not in (None, written)
    assert partial.is_file()

    _age(partial)
    used = driver_java_options(cache_dir=tmp_path)
    archive = _option(used, "SharedArchiveFile")
    assert archive is not None and archive.endswith(".jsa"), used
    assert _option(used, "ArchiveClassesAtExit") is None
    assert Path(archive).is_file() and not partial.exists()
    # A driver that started before the archive existed writes one more: once settled, it is removed.
    (later,) = [Path(p) for p in [_option(again, "ArchiveClassesAtExit")] if p]
    assert _java(again).returncode == 0 and later.is_file()
    _age(later)
    assert _option(driver_java_options(cache_dir=tmp_path), "SharedArchiveFile") == archive
    assert not later.exists()
    started = _java(used, "-Xlog:cds=info")
    assert started.returncode == 0, started.stderr
    assert "sharing" in started.stderr
    assert "Opened archive" in started.stdout and Path(archive).name in started.stdout  # mapped, not refused
    assert "mapped" in started.stdout.lower()


def test_an_archive_cut_short_is_never_used(tmp_path: Path) -> None:
    # Java 17 crashes (SIGBUS) on an archive cut short: a driver killed while writing its archive
    # at exit must not take every later driver down with it.
    run = _java(driver_java_options(cache_dir=tmp_path))
    assert run.returncode == 0, run.stderr
    (written,) = tmp_path.glob("*.partial")
    whole = written.read_bytes()
    assert len(whole) > 8192
    cut = _java("", f"-XX:SharedArchiveFile={_cut(written, whole)}")
    assert cut.returncode != 0  # what the check guards against: this JVM crashes on it

    written.write_bytes(whole[: len(whole) // 2])
    _age(written)
    options = driver_java_options(cache_dir=tmp_path)
    assert _option(options, "SharedArchiveFile") is None, options
    assert _option(options, "ArchiveClassesAtExit") is not None
    assert not written.exists()  # removed once found unusable
    assert not list(tmp_path.glob("*.jsa"))
    assert _java(options).returncode == 0


def _cut(path: Path, whole: bytes) -> Path:
    cut = path.with_name("cut.bin")
    cut.write_bytes(whole[: len(whole) // 2])
    return cut


def test_a_file_that_is_no_archive_is_removed_not_used(tmp_path: Path) -> None:
    key = Path(_option(driver_java_options(cache_dir=tmp_path), "ArchiveClassesAtExit") or "").name.split(".")[0]
    stray = tmp_path / f"{key}.1-abcd.partial"
    stray.write_bytes(b"not an archive" * 100)
    _age(stray)
    options = driver_java_options(cache_dir=tmp_path)
    assert _option(options, "SharedArchiveFile") is None
    assert not stray.exists()


def test_an_archive_named_by_the_environment_is_left_to_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = _java(driver_java_options(cache_dir=tmp_path))
    assert run.returncode == 0
    (theirs,) = tmp_path.glob("*.partial")
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", f"-XX:SharedArchiveFile={theirs}")
    options = driver_java_options(cache_dir=tmp_path / "ours")
    assert options == " ".join(LATER_C2)
    # Both together: Java 17 refuses to start ("DynamicDumpSharedSpaces is unsupported when base CDS
    # archive is not loaded"); the options alone start it.
    both = _java(f"-XX:ArchiveClassesAtExit={tmp_path / 'x.jsa'}")
    assert both.returncode != 0
    assert _java(options).returncode == 0
    assert driver_java_options(cache_dir=tmp_path, class_sharing=False) == " ".join(LATER_C2)


def test_a_cache_folder_that_is_a_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_text("x")
    with pytest.raises(
        InvalidSinkConfigError, match=r"expected a folder the archive can be written to, received '.*file/cds'"
    ):
        driver_java_options(cache_dir=path / "cds")


def test_without_a_java_runtime_only_the_compiler_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    assert driver_java_options(cache_dir=tmp_path / "cds") == " ".join(LATER_C2)
    assert not (tmp_path / "cds").exists()


def _newer_java() -> Path | None:
    for home in sorted(Path("/usr/lib/jvm").glob("*")):
        java = home / "bin" / "java"
        if java.is_file():
            run = subprocess.run([str(java), "-version"], capture_output=True, text=True, check=False)
            feature = feature_version(run.stderr)
            if feature is not None and feature >= 19:
                return home
    return None


def test_java_19_and_later_make_and_renew_the_archive_themselves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = _newer_java()
    if home is None:
        pytest.skip("no Java 19+ runtime under /usr/lib/jvm (this project's machines have Temurin 25)")
    monkeypatch.setenv("JAVA_HOME", str(home))
    options = driver_java_options(cache_dir=tmp_path)
    assert "-XX:+AutoCreateSharedArchive" in options.split()
    archive = Path(_option(options, "SharedArchiveFile") or "")
    assert _java(options).returncode == 0
    assert archive.is_file()
    archive.write_bytes(archive.read_bytes()[:4096])  # cut short: the JVM checks it and writes it anew
    assert _java(options).returncode == 0
    assert archive.stat().st_size > 4096
