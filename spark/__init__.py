"""PySpark jobs over a Stratalog object store: the `stratalog` data source (batch and
streaming), compaction and export. Submodules import pyspark; this package does not."""
