"""Credentials given to the catalog never appear in logs, errors, snapshot summaries, table
properties or files under the checkpoint location.

A stream and bounded writes go through SeaweedFS's REST catalog (an OAuth2 client credential) and
its S3 gateway (access and secret keys), with compaction, and one commit made to fail; meanwhile
every Python logger (the sink's, PySpark's, py4j's: py4j logs each command it sends to the JVM) and
the JVM's log4j output are captured at DEBUG. Each place is then searched for each secret, as is
and base64-encoded (py4j sends byte arrays, such as pickled task closures, as base64).
"""

from __future__ import annotations

import base64
import io
import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from iceberg_sink import IcebergSink, IcebergSinkError
from tests.integration.seaweed import seaweed  # noqa: F401
from tests.integration.test_s3_rest import NAMESPACE, check_s3_table, kv_frame, rest_catalog, sink_builder
from tests.interop.readers import JavaIcebergReader


def _secrets(props: dict[str, str]) -> list[str]:
    return [props["s3.secret-access-key"], props["credential"].split(":", 1)[1]]


def _base64_forms(secret: bytes) -> list[bytes]:
    """Substrings every base64 encoding of data containing ``secret`` contains (one per alignment)."""
    forms = []
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + secret)
        forms.append(encoded[4 if offset else 0 : -4])
    return forms


def _leaks(data: bytes, secrets: list[str]) -> list[str]:
    found = []
    for secret in secrets:
        raw = secret.encode()
        if raw in data:
            found.append(f"{secret[:4]}... as is")
        if any(form in data for form in _base64_forms(raw)):
            found.append(f"{secret[:4]}... base64-encoded")
        if base64.b64encode(raw) in data.replace(b"\n", b""):
            found.append(f"{secret[:4]}... base64-encoded, wrapped")
    return found


@pytest.fixture
def python_logs() -> Iterator[io.StringIO]:
    """Every Python log record at DEBUG, formatted with its arguments."""
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    handler.setLevel(logging.DEBUG)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    loggers = [logging.getLogger(n) for n in ("iceberg_sink", "py4j", "py4j.clientserver", "py4j.java_gateway")]
    old = [(lg, lg.level) for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.DEBUG)
    try:
        yield buffer
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
        for lg, level in old:
            lg.setLevel(level)


@pytest.fixture
def jvm_logs(spark: SparkSession, tmp_path: Path) -> Iterator[Path]:
    """Every log4j event of the driver JVM at DEBUG, in a file (the JVM's stderr is not ours to capture)."""
    path = tmp_path / "jvm-debug.log"
    jvm = spark._jvm  # type: ignore[attr-defined]
    log4j = jvm.org.apache.logging.log4j
    context = log4j.LogManager.getContext(False)
    config = context.getConfiguration()
    layout = log4j.core.layout.PatternLayout.newBuilder().withPattern("%p %c: %m%n").build()
    appender = (
        log4j.core.appender.FileAppender.newBuilder().withFileName(str(path)).setName("secrets-check").setLayout(layout)
    ).build()
    appender.start()
    config.addAppender(appender)
    config.getRootLogger().addAppender(appender, None, None)
    context.updateLoggers()
    spark.sparkContext.setLogLevel("DEBUG")
    try:
        yield path
    finally:
        spark.sparkContext.setLogLevel("ERROR")
        config.getRootLogger().removeAppender("secrets-check")
        context.updateLoggers()
        appender.stop()


def test_secrets_stay_out_of_logs_errors_summaries_properties_and_checkpoints(
    spark: SparkSession,
    seaweed: dict[str, str],  # noqa: F811
    java_reader: JavaIcebergReader,
    python_logs: io.StringIO,
    jvm_logs: Path,
    capfd: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    secrets = _secrets(seaweed)
    assert all(len(s) >= 16 for s in secrets)
    checkpoint = tmp_path / "ckpt"
    errors: list[str] = []

    try:
        sink = (
            sink_builder(seaweed, "secrets")
            # v2: SeaweedFS's table bucket refuses a v3 table's Puffin files (test_v3_rest.py sets
            # another data path).
            .create_if_missing(partition_by=["k"], format_version=2)
            .upsert(key=["id", "k"])
            .compaction(every_n_commits=2)
            .build()
        )
        sink.write(kv_frame(spark, 0, 20, "a"), checkpoint_location=str(checkpoint))
        src = tmp_path / "src"
        kv_frame(spark, 10, 30, "b").write.parquet(str(src))
        raw = spark.readStream.schema("id long, k long, v string").parquet(str(src))
        # File streams read every column as nullable; the table's are required.
        stream = raw.select(*[F.coalesce(F.col(c), F.lit(d)).alias(c) for c, d in (("id", 0), ("k", 0), ("v", ""))])
        query = sink.start(stream, str(checkpoint / "stream"), trigger={"availableNow": True})
        query.awaitTermination(300)
        assert query.exception() is None
        # What was written is read back exactly (Iceberg Java from a copy of the objects, DuckDB from S3).
        expected = kv_frame(spark, 0, 10, "a").union(kv_frame(spark, 10, 30, "b")).toArrow()
        check_s3_table(seaweed, java_reader, sink.load_table().metadata_location, expected, ["id"])

        # A commit that fails: the table is dropped after the checkpoint's files are staged.
        def drop_table(_: object) -> None:
            rest_catalog(seaweed).drop_table(f"{NAMESPACE}.secrets")

        failing = (
            IcebergSink.builder()
            .catalog("rest", **seaweed)
            .table(f"{NAMESPACE}.secrets")
            .upsert(key=["id", "k"])
            .pre_commit_hook(drop_table)
            .build()
        )
        table_before_drop = sink.load_table()
        with pytest.raises(Exception) as failure:
            failing.write(kv_frame(spark, 40, 45, "c"), checkpoint_location=str(checkpoint / "failing"))
        errors.append(f"{type(failure.value).__name__}: {failure.value}")
        assert isinstance(failure.value, IcebergSinkError) or "secrets" in str(failure.value)

        # An S3 write refused for a wrong secret key: the task error travels back through Spark.
        wrong = {**seaweed, "s3.secret-access-key": secrets[0][::-1]}
        refused = IcebergSink.builder().catalog("rest", **wrong).table(f"{NAMESPACE}.other").create_if_missing().build()
        with pytest.raises(Exception) as s3_failure:
            refused.write(spark.range(0, 3).select(F.col("id")))
        errors.append(f"{type(s3_failure.value).__name__}: {s3_failure.value}")
    finally:
        captured = capfd.readouterr()
    jvm_text = jvm_logs.read_bytes()

    logs = python_logs.getvalue()
    assert "iceberg_sink" in logs and "py4j" in logs, "nothing was logged: the check would prove nothing"
    assert b"DEBUG org.apache.spark" in jvm_text, "the JVM logged nothing at DEBUG"
    where = {
        "Python logs": logs.encode(),
        "JVM logs": jvm_text,
        "process output": (captured.out + captured.err).encode(),
        "error messages": "\n".join(errors).encode(),
    }
    summaries = [dict(s.summary.additional_properties) for s in table_before_drop.snapshots() if s.summary]
    assert any("iceberg-sink.job-id" in s for s in summaries)
    where["snapshot summaries"] = repr(summaries).encode()
    where["table properties"] = repr(dict(table_before_drop.properties)).encode()
    files = [p for p in checkpoint.rglob("*") if p.is_file()]
    assert any("committables" in str(p) for p in files), "no pending committable to check"
    for path in files:
        where[f"checkpoint file {path.relative_to(checkpoint)}"] = path.read_bytes()
    leaks = {name: found for name, data in where.items() if (found := _leaks(data, secrets))}
    assert not leaks, leaks
    # The secrets were really in play: the S3 error names the refused request, not the key.
    assert re.search(r"SignatureDoesNotMatch|AccessDenied|ACCESS_DENIED|403|InvalidAccessKeyId", errors[1]), errors[1][
        :2000
    ]


# ---- catalog property values in messages -----------------------------------------------------------
# Secrets whose key names say nothing: a REST header, an Azure connection string, a SQL URI's query
# password (and its user info). A catalog that cannot be loaded must not show any of them, in build()'s
# error, in any CLI command's output, or in the logs; values a YAML file took from the environment
# included.

BEARER = "Bearer eyJhbGciOiJIUzI1NiJ9.c2VjcmV0LWJlYXJlci10b2tlbg.Zm9vYmFyYmF6"
ACCOUNT_KEY = "QUNDT1VOVEtFWS1zZWNyZXQtdmFsdWUtMTIzNDU2Nzg5MA=="
CONNECTION_STRING = (
    f"DefaultEndpointsProtocol=https;AccountName=lakeacct;AccountKey={ACCOUNT_KEY};EndpointSuffix=core.windows.net"
)
QUERY_PASSWORD = "pg-Query-Secret-4711"
USERINFO_PASSWORD = "pg-Userinfo-Secret-0815"

SECRET_SHAPES: dict[str, tuple[dict[str, str], list[str]]] = {
    "REST header": (
        {"type": "rest", "uri": "http://127.0.0.1:1/catalog", "header.Authorization": BEARER},
        [BEARER, BEARER.split(" ", 1)[1]],
    ),
    "ADLS connection string": (
        {"type": "rest", "uri": "http://127.0.0.1:1/catalog", "adls.connection-string": CONNECTION_STRING},
        [CONNECTION_STRING, ACCOUNT_KEY],
    ),
    "SQL URI query password": (
        {"type": "sql", "uri": f"postgresql://127.0.0.1:1/lake?user=sink&password={QUERY_PASSWORD}"},
        [QUERY_PASSWORD],
    ),
    "SQL URI user info": (
        {"type": "sql", "uri": f"postgresql://sink:{USERINFO_PASSWORD}@127.0.0.1:1/lake"},
        [USERINFO_PASSWORD],
    ),
}


def _shown(text: str, secrets: list[str]) -> list[str]:
    return [s[:6] + "..." for s in secrets if s in text or s.replace("=", "%3D") in text]


@pytest.fixture
def all_logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="iceberg_sink")
    return caplog


@pytest.mark.parametrize("shape", sorted(SECRET_SHAPES))
def test_build_never_shows_catalog_property_values(
    shape: str, all_logs: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    props, secrets = SECRET_SHAPES[shape]
    with pytest.raises(IcebergSinkError) as refused:
        IcebergSink.builder().catalog("lake", **props).table("db.t").create_if_missing().build()
    message = str(refused.value)
    assert "could not be loaded" in message and "'lake'" in message, message
    # The harmless keys stay readable; everything else is masked.
    assert f"'type': '{props['type']}'" in message and "127.0.0.1:1" in message, message
    captured = capfd.readouterr()
    for where, text in {
        "error": message,
        "error chain": repr(refused.value.__cause__) + repr(refused.value.__context__),
        "logs": all_logs.text,
        "output": captured.out + captured.err,
    }.items():
        assert not _shown(text, secrets), (where, _shown(text, secrets), text[:2000])


CATALOG_COMMANDS = (
    ["inspect", "db.t"],
    ["compact", "db.t"],
    ["compact", "db.t", "--dry-run"],
    ["convert-equality-deletes", "db.t"],
    ["expire-snapshots", "db.t"],
    ["remove-orphans", "db.t", "--dry-run"],
    ["rewrite-manifests", "db.t"],
    ["inspect", "--checkpoint-location", "nowhere"],
)


@pytest.mark.parametrize("shape", sorted(SECRET_SHAPES))
def test_no_cli_command_shows_catalog_property_values(
    shape: str, all_logs: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    from iceberg_sink.cli import EXIT_NOT_FOUND, main

    props, secrets = SECRET_SHAPES[shape]
    catalog = ["--catalog", "lake", *(a for k, v in props.items() for a in ("--catalog-property", f"{k}={v}"))]
    for command in CATALOG_COMMANDS:
        for extra in ([], ["--json"], ["--debug"]):
            assert main([*command, *catalog, *extra]) == EXIT_NOT_FOUND, (command, extra)
            captured = capsys.readouterr()
            assert "could not be loaded" in captured.err, captured.err
            text = captured.out + captured.err + all_logs.text
            assert not _shown(text, secrets), (command, extra, _shown(text, secrets), text[-2000:])


@pytest.mark.parametrize("shape", sorted(SECRET_SHAPES))
def test_run_never_shows_catalog_property_values_taken_from_the_environment(
    shape: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    all_logs: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from iceberg_sink.cli import EXIT_OK, main

    props, secrets = SECRET_SHAPES[shape]
    lines = []
    for i, (key, value) in enumerate(sorted(props.items())):
        monkeypatch.setenv(f"LAKE_PROP_{i}", value)
        lines.append(f'        "{key}": "${{LAKE_PROP_{i}}}"')
    (tmp_path / "in").mkdir()
    config = tmp_path / "pipeline.yaml"
    config.write_text(
        'source:\n  type: files\n  path: in\n  format: json\n  schema: "id long"\n'
        "sink:\n  table: db.t\n  create_if_missing: {}\n  catalog:\n    name: lake\n    properties:\n"
        + "\n".join(lines)
        + "\ncheckpoint_location: ckpt\ntrigger:\n  availableNow: true\n"
    )
    assert main(["run", str(config), "--validate-only"]) == EXIT_OK
    capsys.readouterr()
    for extra in ([], ["--json"], ["--debug"]):
        assert main(["run", str(config), *extra]) != EXIT_OK
        captured = capsys.readouterr()
        assert "could not be loaded" in captured.err, captured.err[-2000:]
        text = captured.out + captured.err + all_logs.text
        assert not _shown(text, secrets), (extra, _shown(text, secrets), text[-2000:])


def test_refused_catalog_and_spark_settings_are_named_by_key_and_kind_never_by_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 42, item 8: validation refused a catalog property of the wrong shape by printing it, the
    value of an environment variable included (``token: ["${MYTOKEN}"]`` -> ``received a list
    ['<the token>']``), a ``credential`` mapping whole, a Spark setting's key, and a
    ``--catalog-property`` without ``=`` (``header.Authorization:Bearer ...``) in full."""
    from iceberg_sink.cli import EXIT_USAGE, main

    token, credential, password, storage = "tok-8f3a91c2", "cred-77d0e1", "pw-19be44", "s3key-5a6b7c"
    monkeypatch.setenv("MYTOKEN", token)
    monkeypatch.setenv("S3_SECRET", storage)
    (tmp_path / "in").mkdir()
    config = tmp_path / "pipeline.yaml"
    config.write_text(
        'source: {type: files, path: in, format: json, schema: "id long"}\n'
        "sink:\n  table: db.t\n  catalog:\n    name: lake\n    properties:\n"
        '      token: ["${MYTOKEN}"]\n'
        f"      credential: {{client: c, secret: {credential}}}\n"
        "checkpoint_location: ckpt\n"
        'spark: {conf: {spark.hadoop.fs.s3a.secret.key: ["${S3_SECRET}"]}}\n'
    )
    assert main(["run", str(config), "--validate-only"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "sink.catalog.properties.token: expected a string, number or boolean, received a list" in err, err
    assert "sink.catalog.properties.credential: expected a string, number or boolean, received a mapping" in err
    assert "spark.conf.spark.hadoop.fs.s3a.secret.key: expected a string, number or boolean, received a list" in err
    assert not _shown(err, [token, credential, storage]), err

    # A catalog written as one URL string, a password in it.
    config.write_text(
        'source: {type: files, path: in, format: json, schema: "id long"}\n'
        f"sink: {{table: db.t, catalog: 'rest://admin:{password}@rest:8181'}}\ncheckpoint_location: ckpt\n"
    )
    assert main(["run", str(config), "--validate-only"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "sink.catalog: expected a mapping with keys name, properties, received a string" in err, err
    assert not _shown(err, [password]), err

    # A typo on the command line: ':' for '='.
    bearer = "Bearer eyJhbGciOiJIUzI1NiJ9.c2VjcmV0"
    assert main(["inspect", "db.t", "--catalog", "lake", "--catalog-property", f"header.Authorization:{bearer}"]) == (
        EXIT_USAGE
    )
    err = capsys.readouterr().err
    assert "--catalog-property: expected KEY=VALUE" in err, err
    assert not _shown(err, [bearer, bearer.split()[1]]), err
