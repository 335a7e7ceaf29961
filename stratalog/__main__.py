"""`python -m stratalog ...` runs the `stratalog` command."""

from stratalog.infra.cli import main

raise SystemExit(main())
