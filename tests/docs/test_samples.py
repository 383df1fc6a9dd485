"""Every code sample of README.md and docs/ runs, page by page (conventions: tests/docs/samples.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs import samples

PAGES = samples.pages()


@pytest.fixture(scope="module")
def tools(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return samples.tool_dir(tmp_path_factory.mktemp("doc-tools"))


def test_every_fence_follows_the_conventions() -> None:
    """An untagged fence, an unknown language without a title or a not-run without a reason fails here."""
    problems = []
    for page in PAGES:
        try:
            samples.parse(page.read_text(), samples.page_name(page))
        except samples.SampleError as e:
            problems.append(str(e))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("page", PAGES, ids=[samples.page_name(p) for p in PAGES])
def test_samples_run(page: Path, spark: object, tmp_path: Path, tools: Path) -> None:
    try:
        blocks = samples.parse(page.read_text(), samples.page_name(page))
    except samples.SampleError as e:
        pytest.fail(str(e))
    namespace: dict[str, object] = {"__name__": "__docs__", "spark": spark}
    before = set(samples.ROOT.iterdir())
    try:
        samples.run_page(blocks, tmp_path, namespace, tools)
        # Spark's JVM resolves relative paths against its own working directory (the repository here),
        # not the page's: a sample giving Spark a relative path would write into the checkout.
        stray = sorted(p.name for p in set(samples.ROOT.iterdir()) - before)
        assert not stray, (
            f"{samples.page_name(page)}: samples created {stray} in the repository; give Spark absolute paths"
        )
    finally:
        for query in spark.streams.active:  # type: ignore[attr-defined]
            query.stop()
        for value in namespace.values():  # background compactions and conversions of the page's sinks
            for wait in ("await_compactions", "await_conversions"):
                if callable(getattr(type(value), wait, None)):
                    getattr(value, wait)(120)
