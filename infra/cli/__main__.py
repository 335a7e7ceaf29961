"""`python -m stratalog.infra.cli ...` runs the `stratalog` command."""

import sys

from stratalog.infra.cli import main

sys.exit(main())
