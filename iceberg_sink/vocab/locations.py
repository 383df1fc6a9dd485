"""One rule for what a location is: a URI with a scheme, or a local path. Checkpoint locations, the
catalog's embedded roots and the command line's paths all ask it."""

from __future__ import annotations

import re

# A location with a scheme, as Hadoop's Path reads it: ``scheme:`` then ``//authority`` (optional)
# and the path, taken literally (no query, fragment or percent-decoding).
URI = re.compile(r"\A(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*):(?://(?P<authority>[^/]*))?(?P<path>/.*)?\Z", re.S)


def is_uri(location: str) -> bool:
    """Whether ``location`` has a scheme (``file:/ck``, ``file:///ck``, ``hdfs://nn/ck``), as Hadoop's
    ``Path`` decides it: a scheme, a colon, then an authority or an absolute path. Otherwise it is a
    local path (``ck``, ``/ck``); ``committer.store.checkpoint_parts`` refuses ``ck:1``, which Spark cannot use."""
    match = URI.match(location)
    return match is not None and (match.group("path") is not None or match.group("authority") is not None)
