"""PySpark jobs over a Stratalog object store: the `stratalog` data source (batch and
streaming reads from the store, batch and streaming writes through gateways), compaction
and export. Submodules import pyspark; this package does not."""
