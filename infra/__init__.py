"""Running Stratalog: the `stratalog` command line, local cluster launcher and packaging."""
