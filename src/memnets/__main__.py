"""``python -m memnets ...``: the same command line as ``memnets ...``."""
import sys

from .cli.main import main

sys.exit(main())
