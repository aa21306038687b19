"""``python -m pagedkv`` runs the CLI."""

import sys

from pagedkv.entrypoints.cli import main

sys.exit(main())
