"""`python -m infra.cli ...` runs the `stratalog` command."""

import sys

from infra.cli import main

sys.exit(main())
