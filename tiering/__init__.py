"""Bytes at rest: record batches, segments and their indexes, WAL objects, object stores."""
