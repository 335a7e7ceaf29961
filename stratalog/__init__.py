"""Stratalog: an event log that speaks the Kafka wire protocol and keeps its data in object storage.

Every installed module lives under this one name: `stratalog.gateway` (the broker),
`stratalog.tiering` (bytes at rest), `stratalog.coordinator` (metadata),
`stratalog.spark` (the Spark data source and jobs) and `stratalog.infra` (the CLI and
launchers). In the repository each is a top-level folder; pyproject.toml maps the names.
"""
