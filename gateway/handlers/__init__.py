"""One module per API family; importing them registers their handlers."""

import importlib

_MODULES = ("api_versions", "metadata", "produce", "fetch", "list_offsets", "admin",
            "transactions", "groups", "consumer_groups", "offsets", "sasl", "acls", "replicas",
            "quotas", "telemetry", "log_dirs")


def load_handlers() -> None:
    for name in _MODULES:
        importlib.import_module(f"{__name__}.{name}")
