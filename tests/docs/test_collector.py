"""The sample collector itself: what it runs, what it refuses, and that a broken sample fails."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs import samples

PAGE = """# A page

<!-- sample-setup
rows = [1, 2, 3]
-->

```python
total = sum(rows)
```

```text
not code: output or a layout
```

```yaml title="conf/app.yaml"
name: demo
```

```bash
test "$(cat conf/app.yaml)" = "name: demo"
python -c "print('from bash')"
```

<!-- not-run: needs a Kafka cluster -->
```python
raise SystemExit("never runs")
```

1. In a list:

   ```python
   total += 1
   ```
"""


def test_parse_classifies_blocks() -> None:
    blocks = samples.parse(PAGE, "page.md")
    assert [(b.kind, b.line) for b in blocks] == [
        ("setup", 3),
        ("python", 7),
        ("file", 15),
        ("shell", 19),
        ("skip", 25),
        ("python", 31),
    ]
    assert blocks[2].title == "conf/app.yaml"
    assert blocks[4].reason == "needs a Kafka cluster"
    assert blocks[5].code == "total += 1\n"


def test_run_page_runs_in_order_in_one_namespace(tmp_path: Path) -> None:
    namespace: dict[str, object] = {}
    ran = samples.run_page(samples.parse(PAGE, "page.md"), tmp_path, namespace, samples.tool_dir(tmp_path / "bin"))
    assert ran == 5
    assert namespace["total"] == 7
    assert (tmp_path / "conf" / "app.yaml").read_text() == "name: demo\n"


def test_broken_python_sample_fails_naming_its_line(tmp_path: Path) -> None:
    page = "# Broken\n\n```python\nfrom iceberg_sink import IcebergSink\nIcebergSink.builder().no_such_method()\n```\n"
    with pytest.raises(samples.SampleError, match=r"broken\.md:3: python block failed: AttributeError.*no_such_method"):
        samples.run_page(samples.parse(page, "broken.md"), tmp_path, {}, samples.tool_dir(tmp_path / "bin"))


def test_broken_bash_sample_fails_with_its_output(tmp_path: Path) -> None:
    page = "```bash\necho before\niceberg-sink no-such-command\necho never\n```\n"
    with pytest.raises(samples.SampleError, match=r"(?s)broken\.md:1: bash block failed.*no-such-command") as e:
        samples.run_page(samples.parse(page, "broken.md"), tmp_path, {}, samples.tool_dir(tmp_path / "bin"))
    assert "never" not in str(e.value).split("--- stdout")[1]


@pytest.mark.parametrize(
    ("page", "message"),
    [
        ("```\nls\n```\n", r"page\.md:1: untagged fence"),
        ("```yaml\na: 1\n```\n", r"page\.md:1: a 'yaml' block is neither run nor written"),
        ("<!-- not-run: -->\n```python\npass\n```\n", r"page\.md:2: <!-- not-run: --> needs a reason"),
        ("```python\npass\n", r"page\.md:1: fence ``` is never closed"),
        ("<!-- sample-setup\nx = 1\n", r"page\.md:1: <!-- sample-setup is never closed"),
    ],
)
def test_parse_refuses_blocks_outside_the_conventions(page: str, message: str) -> None:
    with pytest.raises(samples.SampleError, match=message):
        samples.parse(page, "page.md")
