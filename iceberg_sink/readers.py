"""Deprecated path, kept for one release: this module moved to ``iceberg_sink.sources.readers``.

``import iceberg_sink.readers`` gives the moved module itself (same objects), with a DeprecationWarning.
"""

import sys
import warnings

from iceberg_sink.sources import readers as _moved

warnings.warn(
    "iceberg_sink.readers moved to iceberg_sink.sources.readers; the old path goes away in the next release",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = _moved
