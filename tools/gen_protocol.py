"""Generate `gateway/protocol/catalog.py` and `gateway/protocol/error_codes.py` from
Kafka's message specs.

    python tools/gen_protocol.py ../shared/kafka-protocol
    python tools/gen_protocol.py --check ../shared/kafka-protocol   # exit 1 if stale

The specs are read only here, at development time; the generated modules carry the
facts (names, types, version ranges, tags, defaults) in the project's own form and
nothing of the specs' prose. Run it again when an API is added to `API_NAMES`.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The APIs the gateway implements, plus the consumer protocol's embedded structures.
API_NAMES = [
    "Produce", "Fetch", "ListOffsets", "Metadata", "OffsetCommit", "OffsetFetch",
    "FindCoordinator", "JoinGroup", "Heartbeat", "LeaveGroup", "SyncGroup",
    "DescribeGroups", "ListGroups", "SaslHandshake", "ApiVersions", "CreateTopics",
    "DeleteTopics", "DeleteRecords", "InitProducerId", "OffsetForLeaderEpoch",
    "DescribeConfigs", "AlterConfigs", "SaslAuthenticate", "CreatePartitions",
    "DeleteGroups", "IncrementalAlterConfigs", "OffsetDelete", "DescribeCluster",
    "DescribeProducers", "DescribeAcls", "CreateAcls", "DeleteAcls",
    "DescribeUserScramCredentials", "AlterUserScramCredentials",
    "AddPartitionsToTxn", "AddOffsetsToTxn", "EndTxn", "TxnOffsetCommit",
    "DescribeTransactions", "ListTransactions", "DescribeClientQuotas", "AlterClientQuotas",
    "ElectLeaders", "AlterPartitionReassignments", "ListPartitionReassignments",
    "ConsumerGroupHeartbeat", "ConsumerGroupDescribe",
    "GetTelemetrySubscriptions", "PushTelemetry", "DescribeLogDirs",
]
HEADERS = ["RequestHeader", "ResponseHeader"]
DATA = ["ConsumerProtocolSubscription", "ConsumerProtocolAssignment"]

PRIMITIVES = {"bool", "int8", "int16", "uint16", "int32", "uint32", "int64", "float64",
              "string", "bytes", "records", "uuid"}
INT_TYPES = {"int8", "int16", "uint16", "int32", "uint32", "int64"}

# Retriable errors, by name: the client may retry the same request after these.
RETRIABLE = {
    "CORRUPT_MESSAGE", "UNKNOWN_TOPIC_OR_PARTITION", "LEADER_NOT_AVAILABLE",
    "NOT_LEADER_OR_FOLLOWER", "REQUEST_TIMED_OUT", "NETWORK_EXCEPTION",
    "COORDINATOR_LOAD_IN_PROGRESS", "COORDINATOR_NOT_AVAILABLE", "NOT_COORDINATOR",
    "NOT_ENOUGH_REPLICAS", "NOT_ENOUGH_REPLICAS_AFTER_APPEND", "NOT_CONTROLLER",
    "KAFKA_STORAGE_ERROR", "FETCH_SESSION_ID_NOT_FOUND", "INVALID_FETCH_SESSION_EPOCH",
    "LISTENER_NOT_FOUND", "FENCED_LEADER_EPOCH", "UNKNOWN_LEADER_EPOCH",
    "OFFSET_NOT_AVAILABLE", "PREFERRED_LEADER_NOT_AVAILABLE", "ELIGIBLE_LEADERS_NOT_AVAILABLE",
    "ELECTION_NOT_NEEDED", "UNSTABLE_OFFSET_COMMIT", "THROTTLING_QUOTA_EXCEEDED",
    "CONCURRENT_TRANSACTIONS", "REBALANCE_IN_PROGRESS", "UNKNOWN_TOPIC_ID",
    "INCONSISTENT_TOPIC_ID", "FETCH_SESSION_TOPIC_ID_ERROR", "OUT_OF_ORDER_SEQUENCE_NUMBER",
}


def load(path: Path) -> dict:
    text = "\n".join(re.sub(r"^\s*//.*$", "", line) for line in path.read_text().splitlines())
    return json.loads(text)


def versions(spec: str | None) -> tuple[int, int] | None:
    if spec is None or spec == "none":
        return None
    if spec.endswith("+"):
        return int(spec[:-1]), 0x7FFF
    if "-" in spec:
        lo, hi = spec.split("-")
        return int(lo), int(hi)
    return int(spec), int(spec)


def snake(name: str) -> str:
    s = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    s = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", s)
    return s.lower()


def default_for(ftype: str, raw) -> object:
    if raw is None:
        if ftype in INT_TYPES:
            return 0
        return {"bool": False, "float64": 0.0, "string": "", "bytes": b"",
                "records": None, "uuid": None}.get(ftype)
    raw = str(raw)
    if raw == "null":
        return None
    if ftype in INT_TYPES:
        return int(raw, 0)
    if ftype == "bool":
        return raw == "true"
    if ftype == "float64":
        return float(raw)
    return raw


def render_fields(fields: list[dict], common: dict[str, list[dict]], indent: int) -> str:
    pad = " " * indent
    out = []
    for f in fields:
        ftype = f["type"]
        elem = ftype[2:] if ftype.startswith("[]") else ftype
        sub = f.get("fields")
        if elem not in PRIMITIVES:
            sub = sub if sub is not None else common[elem]
            kind = "[]struct" if ftype.startswith("[]") else "struct"
        else:
            kind = ftype
        vr = versions(f["versions"]) or (0, -1)
        args = [repr(snake(f["name"])), repr(kind), str(vr[0])]
        kw = []
        if vr[1] != 0x7FFF:
            kw.append(f"vmax={vr[1]}")
        nv = versions(f.get("nullableVersions"))
        if nv:
            kw.append(f"nullable={nv}")
        if "tag" in f:
            kw.append(f"tag={f['tag']}")
            kw.append(f"tagged={versions(f['taggedVersions'])}")
        if kind.startswith("[]") or kind == "struct":
            if f.get("default") == "null":
                kw.append("default='null'")
        else:
            d = default_for(kind, f.get("default"))
            if d is not None or f.get("default") == "null":
                kw.append(f"default={d!r}")
        if f.get("flexibleVersions") == "none":
            kw.append("never_flexible=True")
        if sub is not None:
            kw.append("fields=(\n" + render_fields(sub, common, indent + 4) + pad + ")")
        out.append(f"{pad}F({', '.join(args + kw)}),\n")
    return "".join(out)


def render_schema(var: str, spec: dict) -> str:
    common = {c["name"]: c["fields"] for c in spec.get("commonStructs", [])}
    vr = versions(spec["validVersions"])
    flex = versions(spec.get("flexibleVersions"))
    flex_from = None if flex is None else flex[0]
    body = render_fields(spec["fields"], common, 4)
    return (f"{var} = Schema({spec['name']!r}, {vr[0]}, {vr[1]}, {flex_from}, (\n"
            f"{body}))\n\n")


def generate_catalog(src: Path) -> str:
    parts = [
        '"""Message schemas for every API the gateway speaks.\n\n'
        "Generated by tools/gen_protocol.py from Kafka's message specs: do not edit.\n"
        '"""\n\n',
        "from enum import IntEnum\n\n",
        "from .schema import Field as F, Schema\n\n",
    ]
    apis = []  # (api key, name, schema variable prefix)
    for name in HEADERS + DATA:
        parts.append(render_schema(snake(name).upper(), load(src / f"{name}.json")))
    for name in API_NAMES:
        req = load(src / f"{name}Request.json")
        resp = load(src / f"{name}Response.json")
        var = snake(name).upper()
        parts.append(render_schema(f"{var}_REQUEST", req))
        parts.append(render_schema(f"{var}_RESPONSE", resp))
        apis.append((req["apiKey"], name, var))
    apis.sort()
    # Kafka's own spelling of the keys (its ApiKeys enum): the spec name in upper snake case.
    parts.append("\nclass ApiKey(IntEnum):\n"
                 '    """The APIs above, by the key a request header carries."""\n\n')
    parts.extend(f"    {var} = {key}\n" for key, _name, var in apis)
    parts.append("\n\n# api key -> (name, request schema, response schema); keyed by ApiKey members, typed\n"
                 "# by int so that a key decoded from a request header looks its API up as it is.\n"
                 "APIS: dict[int, tuple[str, Schema, Schema]] = {\n")
    parts.extend(f"    ApiKey.{var}: ({name!r}, {var}_REQUEST, {var}_RESPONSE),\n"
                 for _key, name, var in apis)
    parts.append("}\n")
    return "".join(parts)


def generate_errors(src: Path) -> str:
    rows = []
    for line in (src / "error-codes.tsv").read_text().splitlines()[1:]:
        code, name = line.split("\t")[:2]
        rows.append((int(code), name))
    out = [
        '"""Kafka error codes: the one table of them.\n\n'
        "Generated by tools/gen_protocol.py: do not edit.\n"
        '"""\n\n',
        "from enum import IntEnum\n\n\n",
        "class ErrorCode(IntEnum):\n",
    ]
    for code, name in rows:
        out.append(f"    {name} = {code}\n")
    out.append("\n\nRETRIABLE = frozenset({\n")
    for _code, name in rows:
        if name in RETRIABLE:
            out.append(f"    ErrorCode.{name},\n")
    out.append("})\n")
    return "".join(out)


def main() -> None:
    args = sys.argv[1:]
    check = "--check" in args
    args = [a for a in args if a != "--check"]
    src = Path(args[0] if args else ROOT.parent / "shared" / "kafka-protocol")
    outputs = {
        ROOT / "gateway/protocol/catalog.py": generate_catalog(src),
        ROOT / "gateway/protocol/error_codes.py": generate_errors(src),
    }
    if check:
        stale = [p for p, text in outputs.items() if p.read_text() != text]
        for p in stale:
            print(f"{p.relative_to(ROOT)} differs from what {Path(__file__).name} generates")
        sys.exit(1 if stale else 0)
    for p, text in outputs.items():
        p.write_text(text)


if __name__ == "__main__":
    main()
