"""Deprecated path, kept for one release: this module moved to ``iceberg_sink.observe.metrics``.

``import iceberg_sink.metrics`` gives the moved module itself (same objects), with a DeprecationWarning.
"""

import sys
import warnings

from iceberg_sink.observe import metrics as _moved

warnings.warn(
    "iceberg_sink.metrics moved to iceberg_sink.observe.metrics; the old path goes away in the next release",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = _moved
