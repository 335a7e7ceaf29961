"""Object-store backends behind one interface, chosen by URL scheme."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlsplit

from stratalog.tiering.objectstore.base import ObjectInfo, ObjectNotFound, ObjectStore, ObjectStoreError

__all__ = ["ObjectInfo", "ObjectNotFound", "ObjectStore", "ObjectStoreError", "open_store"]

SCHEMES = ("file", "s3")


def open_store(url: str, **options) -> ObjectStore:
    """The store a URL names: `file:///abs/path` or `s3://bucket[/prefix]`.

    Options go to the backend (for S3: endpoint_url, region, path_style, profile,
    multipart_threshold, part_size, max_attempts, ...)."""
    if not isinstance(url, str) or "://" not in url:
        raise ValueError(f"object store URL must look like file:///path or s3://bucket/prefix, got {url!r}")
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if parts.query or parts.fragment:
        raise ValueError(f"object store URL takes no query or fragment: {url!r}")
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"file URL must be file:///absolute/path (no host), got {url!r}")
        path = unquote(parts.path)
        if not path.startswith("/") or path == "/":
            raise ValueError(f"file URL needs an absolute directory below /, got {url!r}")
        from stratalog.tiering.objectstore.file import FileObjectStore

        if options:
            raise ValueError(f"file object store takes no options, got {sorted(options)}")
        return FileObjectStore(Path(path))
    if scheme == "s3":
        bucket = parts.netloc
        if not bucket or "@" in bucket or ":" in bucket:
            raise ValueError(f"s3 URL must be s3://bucket/prefix, got {url!r}")
        from stratalog.tiering.objectstore.s3 import S3ObjectStore

        return S3ObjectStore(bucket, unquote(parts.path).strip("/"), **options)
    raise ValueError(f"unknown object store scheme {parts.scheme!r} in {url!r}; expected one of {', '.join(SCHEMES)}")
