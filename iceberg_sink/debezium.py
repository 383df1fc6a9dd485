"""Deprecated path, kept for one release: this module moved to ``iceberg_sink.sources.debezium``.

``import iceberg_sink.debezium`` gives the moved module itself (same objects), with a DeprecationWarning.
"""

import sys
import warnings

from iceberg_sink.sources import debezium as _moved

warnings.warn(
    "iceberg_sink.debezium moved to iceberg_sink.sources.debezium; the old path goes away in the next release",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = _moved
