"""``python -m iceberg_sink.cli``: the same as the ``iceberg-sink`` console script."""

import sys

from iceberg_sink.cli.main import main

sys.exit(main())
