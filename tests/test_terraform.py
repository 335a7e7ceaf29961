"""terraform/: formatting, validation, an apply of examples/local against moto, a plan of
examples/complete against moto.

The tree is copied into a temporary directory before `terraform init`, so no .terraform
directory, lock file or state is ever left in the repository.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from unittest import mock

import boto3
import pytest

from stratalog.infra.processes import free_port
from botocore.exceptions import ClientError

REPO = Path(__file__).resolve().parent.parent
TERRAFORM_SRC = REPO / "terraform"
TERRAFORM = shutil.which("terraform") or "/usr/local/bin/terraform"
PLUGIN_DIR = Path("/opt/tf-plugins")

pytestmark = [
    pytest.mark.skipif(not Path(TERRAFORM).is_file(), reason="terraform binary not installed"),
    pytest.mark.skipif(not PLUGIN_DIR.is_dir(), reason="no provider mirror at /opt/tf-plugins"),
]

MODULES = ["bucket", "iam", "etcd", "gateways", "security"]
CONFIGS = ["."] + [f"modules/{m}" for m in MODULES] + ["examples/complete", "examples/local"]

REGION = "us-east-1"
DUMMY_KEY = "testing"



def _tf(args: list[str], cwd: Path, env: dict, ok_codes: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [TERRAFORM, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    if proc.returncode not in ok_codes:
        raise AssertionError(
            f"terraform {' '.join(args)} in {cwd} exited {proc.returncode}\n"
            f"--- stdout ---\n{proc.stdout[-6000:]}\n--- stderr ---\n{proc.stderr[-6000:]}"
        )
    return proc


@pytest.fixture(scope="module")
def tf_env(tmp_path_factory) -> dict:
    home = tmp_path_factory.mktemp("tf-home")
    cli_config = home / "terraformrc"
    cli_config.write_text("")  # isolates the runs from any user or machine CLI configuration
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "TF_"))}
    env.update(
        TF_CLI_CONFIG_FILE=str(cli_config),
        TF_IN_AUTOMATION="1",
        TF_INPUT="0",
        CHECKPOINT_DISABLE="1",
        AWS_ACCESS_KEY_ID=DUMMY_KEY,
        AWS_SECRET_ACCESS_KEY=DUMMY_KEY,
        AWS_DEFAULT_REGION=REGION,
        AWS_EC2_METADATA_DISABLED="true",
    )
    return env


@pytest.fixture(scope="module")
def tf_tree(tmp_path_factory, tf_env) -> Path:
    """A copy of terraform/ with every module and example initialised from the local mirror."""
    root = tmp_path_factory.mktemp("tf") / "terraform"
    shutil.copytree(
        TERRAFORM_SRC,
        root,
        ignore=shutil.ignore_patterns(".terraform", ".terraform.lock.hcl", "*.tfstate*", "*.tfplan"),
    )

    def init(config: str) -> None:
        _tf(
            ["init", f"-plugin-dir={PLUGIN_DIR}", "-backend=false", "-no-color"],
            root / config,
            tf_env,
        )

    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(init, CONFIGS))
    return root


@pytest.fixture
def moto_url():
    from moto_fixture import MotoServer

    server = MotoServer(port=free_port()).start()
    try:
        yield server.url
    finally:
        server.stop()


def _client(service: str, url: str):
    return boto3.client(
        service,
        endpoint_url=url,
        region_name=REGION,
        aws_access_key_id=DUMMY_KEY,
        aws_secret_access_key=DUMMY_KEY,
    )


# ---------------------------------------------------------------------------------------------
# Static checks
# ---------------------------------------------------------------------------------------------


OUTPUT_PREFIXES = {
    "modules/bucket": ("s3_bucket_",),
    "modules/iam": ("iam_",),
    "modules/etcd": ("etcd_",),
    "modules/gateways": ("gateways_",),
    "modules/security": ("security_group_",),
    ".": ("s3_bucket_", "iam_", "etcd_", "gateways_", "security_group_"),
}


def _blocks(path: Path, kind: str) -> dict[str, str]:
    """Top-level `kind "name" { ... }` blocks of a file, by name."""
    found = re.findall(rf'^{kind} "([^"]+)" {{\n(.*?)^}}', path.read_text(), flags=re.M | re.S)
    return dict(found)


def test_every_module_follows_the_conventions():
    for config in CONFIGS:
        d = TERRAFORM_SRC / config
        for name in ("main.tf", "variables.tf", "outputs.tf", "versions.tf"):
            assert (d / name).is_file(), f"{config} lacks {name}"
        variables = _blocks(d / "variables.tf", "variable")
        assert variables, f"{config} declares no variable"
        for var, body in variables.items():
            assert re.search(r"^  description\s*= \"\S", body, re.M), f"{config}: {var} has no description"
            assert re.search(r"^  type\s*= \S", body, re.M), f"{config}: {var} has no type"
        outputs = _blocks(d / "outputs.tf", "output")
        assert outputs, f"{config} declares no output"
        for out, body in outputs.items():
            assert re.search(r"^  description\s*= \"\S", body, re.M), f"{config}: output {out} has no description"
            if config in OUTPUT_PREFIXES:
                assert out.startswith(OUTPUT_PREFIXES[config]), f"{config}: output {out} is not prefixed"
    assert not list(TERRAFORM_SRC.rglob(".terraform")), "a .terraform directory was left in the repository"
    assert not list(TERRAFORM_SRC.rglob("*.tfstate*")), "a state file was left in the repository"


def test_readme_tables_list_every_input_and_output():
    readme = (TERRAFORM_SRC / "README.md").read_text()
    sections = {chunk.split("\n", 1)[0].strip(): chunk for chunk in readme.split("\n### ")[1:]}
    for config in CONFIGS:
        section = sections["Root module" if config == "." else config]
        for name in _blocks(TERRAFORM_SRC / config / "variables.tf", "variable"):
            assert f"| `{name}` |" in section, f"README lacks input {name} of {config}"
        for name in _blocks(TERRAFORM_SRC / config / "outputs.tf", "output"):
            assert f"| `{name}` |" in section, f"README lacks output {name} of {config}"


def test_fmt_check_passes(tf_env):
    _tf(["fmt", "-check", "-recursive", "-diff", "-no-color"], TERRAFORM_SRC, tf_env)


def test_fmt_check_catches_misformatted_code(tf_env, tmp_path):
    (tmp_path / "bad.tf").write_text('variable "x" {\ntype=string\n}\n')
    proc = _tf(["fmt", "-check", "-no-color"], tmp_path, tf_env, ok_codes=(3,))
    assert "bad.tf" in proc.stdout


@pytest.fixture(scope="module")
def validations(tf_tree, tf_env) -> dict[str, dict]:
    """`terraform validate -json` of every configuration, run side by side: each run spends most
    of its time loading the provider's schema."""

    def validate(config: str) -> dict:
        proc = _tf(["validate", "-json", "-no-color"], tf_tree / config, tf_env, ok_codes=(0, 1))
        return json.loads(proc.stdout)

    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(zip(CONFIGS, pool.map(validate, CONFIGS)))


@pytest.mark.parametrize("config", CONFIGS)
def test_validate(validations, config):
    result = validations[config]
    assert result["valid"], result["diagnostics"]
    assert result["warning_count"] == 0, result["diagnostics"]


def test_a_bad_cluster_prefix_is_rejected_before_anything_is_created(tf_tree, tf_env):
    """Variable validations are live: a prefix with a leading slash fails the plan with a clear
    message. The endpoints point at a closed local port, so reaching AWS would fail differently."""
    closed = f"http://127.0.0.1:{free_port()}"
    proc = _tf(
        [
            "plan", "-no-color", "-var", "cluster_prefix=/dev/",
            "-var", f"s3_endpoint={closed}", "-var", f"iam_endpoint={closed}", "-var", f"sts_endpoint={closed}",
        ],
        tf_tree / "examples/local",
        tf_env,
        ok_codes=(1,),
    )  # fmt: skip
    assert "cluster_prefix must be" in proc.stderr, proc.stderr


# ---------------------------------------------------------------------------------------------
# examples/local: apply, verify, re-plan, destroy against moto
# ---------------------------------------------------------------------------------------------


def _outputs(cwd: Path, env: dict) -> dict:
    raw = json.loads(_tf(["output", "-json", "-no-color"], cwd, env).stdout)
    return {name: entry["value"] for name, entry in raw.items()}


def run_gateway_against(outputs: dict, env: dict, tmp_path: Path) -> None:
    """A real gateway on the bucket the local example created: it serves produce and
    consume, and its objects land under the cluster prefix the gateway role may write."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    from conftest import GatewayProcess

    gw = GatewayProcess(tmp_path / "gateway-data", {"log.roll.ms": 300}, extra_args=[
        "--object-store", outputs["object_store_url"], "--s3-endpoint", outputs["s3_endpoint_url"],
        "--s3-path-style"])
    aws_env = {k: v for k, v in env.items() if k.startswith("AWS_")}
    with mock.patch.dict(os.environ, aws_env):
        gw.start()
    try:
        p = Producer({"bootstrap.servers": gw.bootstrap, "acks": "all"})
        for i in range(20):
            p.produce("tf-smoke", value=f"r{i}".encode())
        assert p.flush(30) == 0
        c = Consumer({"bootstrap.servers": gw.bootstrap, "group.id": "tf", "enable.auto.commit": False})
        c.assign([TopicPartition("tf-smoke", 0, 0)])
        got = []
        for _ in range(60):
            m = c.poll(0.5)
            if m is not None and not m.error():
                got.append(m.value())
            if len(got) == 20:
                break
        c.close()
        assert got == [f"r{i}".encode() for i in range(20)]
        s3 = _client("s3", outputs["s3_endpoint_url"])
        bucket, prefix = outputs["object_store_url"].removeprefix("s3://").split("/", 1)
        for _ in range(100):  # log.roll.ms is short: the segment is sealed into the bucket
            keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]
            if any(k.startswith(f"{prefix}/topics/tf-smoke-") and k.endswith(".log") for k in keys):
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"no sealed segment in the bucket: {keys}")
        assert all(k.startswith(prefix + "/") for k in keys), keys
    finally:
        gw.stop()


def _check_bucket(s3, bucket: str, prefix: str) -> None:
    s3.head_bucket(Bucket=bucket)

    sse = s3.get_bucket_encryption(Bucket=bucket)["ServerSideEncryptionConfiguration"]["Rules"]
    assert sse[0]["ApplyServerSideEncryptionByDefault"]["SSEAlgorithm"] == "AES256"

    pab = s3.get_public_access_block(Bucket=bucket)["PublicAccessBlockConfiguration"]
    assert pab == {
        "BlockPublicAcls": True,
        "IgnorePublicAcls": True,
        "BlockPublicPolicy": True,
        "RestrictPublicBuckets": True,
    }

    ownership = s3.get_bucket_ownership_controls(Bucket=bucket)["OwnershipControls"]["Rules"]
    assert ownership == [{"ObjectOwnership": "BucketOwnerEnforced"}]

    policy = json.loads(s3.get_bucket_policy(Bucket=bucket)["Policy"])
    [deny] = policy["Statement"]
    assert deny["Effect"] == "Deny"
    assert deny["Action"] == "s3:*"
    assert deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    assert sorted(deny["Resource"]) == [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"]

    rules = {r["ID"]: r for r in s3.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]}
    assert set(rules) == {"abort-incomplete-multipart-uploads", "transition-old-segments"}
    abort = rules["abort-incomplete-multipart-uploads"]
    assert abort["Status"] == "Enabled"
    assert abort["AbortIncompleteMultipartUpload"] == {"DaysAfterInitiation": 1}
    assert abort["Filter"].get("Prefix", "") == ""  # the whole bucket
    transition = rules["transition-old-segments"]
    assert transition["Status"] == "Enabled"
    assert transition["Filter"] == {"Prefix": f"{prefix}/topics/"}
    assert transition["Transitions"] == [{"Days": 30, "StorageClass": "STANDARD_IA"}]


def _policy_document(iam, role_name: str) -> dict:
    [attached] = iam.list_attached_role_policies(RoleName=role_name)["AttachedPolicies"]
    policy = iam.get_policy(PolicyArn=attached["PolicyArn"])["Policy"]
    version = iam.get_policy_version(PolicyArn=policy["Arn"], VersionId=policy["DefaultVersionId"])
    document = version["PolicyVersion"]["Document"]
    return json.loads(document) if isinstance(document, str) else document


def _as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def _check_role(iam, role_name: str, bucket: str, prefix: str, object_actions: set[str]) -> None:
    role = iam.get_role(RoleName=role_name)["Role"]
    trust = role["AssumeRolePolicyDocument"]
    trust = json.loads(trust) if isinstance(trust, str) else trust
    services = {s for st in trust["Statement"] for s in _as_list(st["Principal"]["Service"])}
    assert services == {"ecs-tasks.amazonaws.com", "ec2.amazonaws.com"}

    bucket_arn = f"arn:aws:s3:::{bucket}"
    statements = _policy_document(iam, role_name)["Statement"]
    granted: set[str] = set()
    for st in statements:
        assert st["Effect"] == "Allow"
        actions = set(_as_list(st["Action"]))
        granted |= actions
        assert not any(a.endswith("*") for a in actions), f"wildcard action in {role_name}: {actions}"
        for resource in _as_list(st["Resource"]):
            if resource == bucket_arn:
                # Bucket-level access only for listings inside the cluster prefix.
                assert actions == {"s3:ListBucket"}
                [(test, condition)] = st["Condition"].items()
                assert test == "StringLike"
                assert sorted(_as_list(condition["s3:prefix"])) == [prefix, f"{prefix}/*"]
            else:
                assert resource == f"{bucket_arn}/{prefix}/*", f"{role_name} reaches beyond the prefix: {resource}"
    assert granted == object_actions | {"s3:ListBucket"}


def test_local_example_applies_against_moto(tf_tree, tf_env, moto_url, tmp_path):
    cwd = tf_tree / "examples/local"
    env = dict(tf_env)
    endpoint_vars = [
        "-var", f"s3_endpoint={moto_url}",
        "-var", f"iam_endpoint={moto_url}",
        "-var", f"sts_endpoint={moto_url}",
        "-var", f"access_key={DUMMY_KEY}",
        "-var", f"secret_key={DUMMY_KEY}",
    ]  # fmt: skip
    # The endpoint speaks plain HTTP, so the example leaves the TLS-only policy off unless asked;
    # ask first, to check the policy the AWS deployment gets.
    tls_only = [*endpoint_vars, "-var", "enforce_tls=true"]

    _tf(["apply", "-auto-approve", "-no-color", *tls_only], cwd, env)
    outputs = _outputs(cwd, env)
    bucket, prefix = outputs["s3_bucket_id"], "dev"
    assert outputs["object_store_url"] == f"s3://{bucket}/{prefix}"
    assert outputs["s3_endpoint_url"] == moto_url

    # A second plan finds nothing to change: the modules are stable against what S3 and IAM return.
    _tf(["plan", "-detailed-exitcode", "-no-color", *tls_only], cwd, env)

    s3, iam = _client("s3", moto_url), _client("iam", moto_url)
    _check_bucket(s3, bucket, prefix)
    with pytest.raises(ClientError) as denied:  # the policy bites: no object access over plain HTTP
        s3.put_object(Bucket=bucket, Key=f"{prefix}/wal/0/1.wal", Body=b"x")
    assert denied.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403

    gateway_role = outputs["iam_gateway_role_arn"].rsplit("/", 1)[1]
    reader_role = outputs["iam_reader_role_arn"].rsplit("/", 1)[1]
    _check_role(
        iam,
        gateway_role,
        bucket,
        prefix,
        {"s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"},
    )
    _check_role(iam, reader_role, bucket, prefix, {"s3:GetObject"})

    # Back to the example's default for an http endpoint: the policy goes, everything else stays.
    _tf(["apply", "-auto-approve", "-no-color", *endpoint_vars], cwd, env)
    with pytest.raises(ClientError) as no_policy:
        s3.get_bucket_policy(Bucket=bucket)
    assert no_policy.value.response["Error"]["Code"] == "NoSuchBucketPolicy"
    s3.head_bucket(Bucket=bucket)

    # A gateway started from the example's outputs serves produce and consume.
    run_gateway_against(outputs, env, tmp_path)
    # Whatever a gateway leaves behind, destroy must still succeed (force_destroy in the example).
    s3.put_object(Bucket=bucket, Key=f"{prefix}/topics/orders-x/0/00000000000000000000-0-a.log", Body=b"x")

    _tf(["destroy", "-auto-approve", "-no-color", *endpoint_vars], cwd, env)
    with pytest.raises(ClientError) as gone:
        s3.head_bucket(Bucket=bucket)
    assert gone.value.response["Error"]["Code"] in ("404", "NoSuchBucket")
    for role in (gateway_role, reader_role):
        with pytest.raises(iam.exceptions.NoSuchEntityException):
            iam.get_role(RoleName=role)
    assert [p for p in iam.list_policies(Scope="Local")["Policies"] if p["PolicyName"].startswith("stratalog")] == []
    assert json.loads((cwd / "terraform.tfstate").read_text())["resources"] == []


# ---------------------------------------------------------------------------------------------
# examples/complete: plans against moto's endpoints
# ---------------------------------------------------------------------------------------------


def _plan_json(cwd: Path, env: dict, tfvars: dict, tmp_path: Path) -> dict:
    var_file = tmp_path / "test.tfvars.json"
    var_file.write_text(json.dumps(tfvars))
    plan_file = tmp_path / "complete.tfplan"
    _tf(["plan", "-no-color", f"-var-file={var_file}", f"-out={plan_file}"], cwd, env)
    return json.loads(_tf(["show", "-json", "-no-color", str(plan_file)], cwd, env).stdout)


def _tf_plan_failure(cwd: Path, env: dict, tfvars: dict, tmp_path: Path) -> str:
    """The error output of a plan that must fail."""
    var_file = tmp_path / "test.tfvars.json"
    var_file.write_text(json.dumps(tfvars))
    proc = _tf(["plan", "-no-color", f"-var-file={var_file}"], cwd, env, ok_codes=(1,))
    return proc.stdout + proc.stderr


def _creates(plan: dict) -> dict[str, list[dict]]:
    by_type: dict[str, list[dict]] = {}
    for rc in plan["resource_changes"]:
        if rc["change"]["actions"] == ["create"]:
            by_type.setdefault(rc["type"], []).append(rc)
    return by_type


def _emulator_vars(moto_url: str) -> dict:
    return {
        "aws_endpoint_url": moto_url,
        "skip_aws_checks": True,
        "region": REGION,
        "vpc_id": "vpc-0a1b2c3d",
        "private_subnet_ids": ["subnet-0000aaaa", "subnet-0000bbbb", "subnet-0000cccc"],
        "public_subnet_ids": ["subnet-1111aaaa", "subnet-1111bbbb"],
        "allowed_cidr_blocks": ["203.0.113.0/24"],
    }


def test_complete_example_plans_the_whole_stack(tf_tree, tf_env, moto_url, tmp_path):
    plan = _plan_json(
        tf_tree / "examples/complete",
        tf_env,
        {**_emulator_vars(moto_url), "etcd_ami_id": "ami-0123456789abcdef0", "tls_certificate_arn": CERT_ARN},
        tmp_path,
    )
    creates = _creates(plan)
    for kind, count in {
        "aws_secretsmanager_secret": 1,
        "aws_secretsmanager_secret_version": 1,
        "aws_iam_role_policy": 1,  # the execution role may read that secret, nothing else new
        "aws_s3_bucket": 1,
        "aws_iam_role": 3,  # gateway, reader, task execution
        "aws_instance": 3,
        "aws_ebs_volume": 3,
        "aws_volume_attachment": 3,
        "aws_network_interface": 3,
        "aws_ecs_service": 3,
        "aws_ecs_task_definition": 3,
        "aws_lb": 1,
        "aws_lb_listener": 3,
        "aws_lb_target_group": 3,
        "aws_cloudwatch_log_group": 1,
        "aws_security_group": 3,
    }.items():
        assert len(creates.get(kind, [])) == count, f"{kind}: {len(creates.get(kind, []))} planned"

    listeners = sorted(rc["change"]["after"]["port"] for rc in creates["aws_lb_listener"])
    assert listeners == [9092, 9093, 9094]
    for rc in creates["aws_lb_listener"]:  # SASL_SSL by default: TLS ends at the load balancer
        after = rc["change"]["after"]
        assert (after["protocol"], after["certificate_arn"]) == ("TLS", CERT_ARN)
        assert after["ssl_policy"].startswith("ELBSecurityPolicy-TLS13")
    for tg in creates["aws_lb_target_group"]:
        [hc] = tg["change"]["after"]["health_check"]
        assert (hc["protocol"], hc["port"], hc["path"]) == ("HTTP", "9644", "/readyz")
    [lb] = creates["aws_lb"]
    assert lb["change"]["after"]["internal"] is False  # public subnets were given
    kafka_rules = [
        rc["change"]["after"]
        for rc in creates["aws_vpc_security_group_ingress_rule"]
        if rc["change"]["after"].get("cidr_ipv4") is not None
    ]
    assert sorted((r["from_port"], r["cidr_ipv4"]) for r in kafka_rules) == [
        (9092, "203.0.113.0/24"),
        (9093, "203.0.113.0/24"),
        (9094, "203.0.113.0/24"),
    ]
    for volume in creates["aws_ebs_volume"]:
        assert volume["change"]["after"]["encrypted"] is True
    for instance in creates["aws_instance"]:
        assert instance["change"]["after"]["ami"] == "ami-0123456789abcdef0"


def test_complete_example_with_existing_etcd_runs_the_documented_command(tf_tree, tf_env, moto_url, tmp_path):
    plan = _plan_json(
        tf_tree / "examples/complete",
        tf_env,
        {
            **_emulator_vars(moto_url),
            "public_subnet_ids": [],
            "bucket_name": "stratalog-demo-data",
            "advertised_host": "kafka.example.internal",
            "etcd_existing_endpoints": ["10.0.1.10:2379", "10.0.2.10:2379"],
            "container_image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/stratalog:1.0",
            "security_protocol": "PLAINTEXT",  # the explicit opt-out: the plain command
        },
        tmp_path,
    )
    creates = _creates(plan)
    assert "aws_instance" not in creates and "aws_ebs_volume" not in creates
    assert len(creates["aws_security_group"]) == 2  # no etcd group without etcd members
    [lb] = creates["aws_lb"]
    assert lb["change"]["after"]["internal"] is True

    tasks = sorted(creates["aws_ecs_task_definition"], key=lambda rc: rc["change"]["after"]["family"])
    assert [t["change"]["after"]["family"] for t in tasks] == [f"stratalog-demo-gateway-{i}" for i in range(3)]
    for i, task in enumerate(tasks):
        [container] = json.loads(task["change"]["after"]["container_definitions"])
        assert container["image"] == "123456789012.dkr.ecr.us-east-1.amazonaws.com/stratalog:1.0"
        assert container["entryPoint"] == ["stratalog"]
        assert container["command"] == [
            "serve",
            "--listen", "0.0.0.0:9092",
            "--http", "0.0.0.0:9644",
            "--data-dir", "/var/lib/stratalog",
            "--advertised", f"kafka.example.internal:{9092 + i}",
            "--coordinator", "etcd://10.0.1.10:2379,10.0.2.10:2379",
            "--object-store", "s3://stratalog-demo-data/prod",
            "--broker-id", str(i),
        ]  # fmt: skip
        assert {p["containerPort"] for p in container["portMappings"]} == {9092, 9644}
        assert container["logConfiguration"]["logDriver"] == "awslogs"

    outputs = plan["planned_values"]["outputs"]
    assert outputs["gateways_bootstrap_servers"]["value"] == (
        "kafka.example.internal:9092,kafka.example.internal:9093,kafka.example.internal:9094"
    )
    assert outputs["etcd_endpoints"]["value"] == ["10.0.1.10:2379", "10.0.2.10:2379"]
    assert outputs["s3_bucket_id"]["value"] == "stratalog-demo-data"


CERT_ARN = "arn:aws:acm:us-east-1:123456789012:certificate/0a1b2c3d-4e5f-6789-abcd-ef0123456789"


def test_the_default_gateways_authenticate_and_set_the_admin_password_first(tf_tree, tf_env, moto_url, tmp_path):
    """SASL_SSL by default: each container sets the admin user's SCRAM password from the
    secret, then runs a SASL listener with ACLs on. The generated shell line is run here with
    a stand-in `stratalog` that records what it was given."""
    import shlex
    import stat
    import subprocess

    plan = _plan_json(
        tf_tree / "examples/complete",
        tf_env,
        {**_emulator_vars(moto_url), "public_subnet_ids": [], "advertised_host": "kafka.example.internal",
         "bucket_name": "stratalog-demo-data", "etcd_existing_endpoints": ["10.0.1.10:2379"],
         "tls_certificate_arn": CERT_ARN},
        tmp_path,
    )
    creates = _creates(plan)
    [secret] = creates["aws_secretsmanager_secret"]
    # The task definition names the secret by its ARN, known only after apply; the command is
    # known now (the same locals build both).
    commands = plan["planned_values"]["outputs"]["gateways_container_commands"]["value"]
    sh, dash_c, line = commands[1]
    assert (sh, dash_c) == ("sh", "-c")
    [task] = [rc for rc in creates["aws_ecs_task_definition"]
              if rc["change"]["after"]["family"].endswith("-gateway-1")]
    assert task["change"]["after_unknown"]["container_definitions"] is True  # it holds the secret's ARN

    fake = tmp_path / "bin" / "stratalog"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$RECORD.$1"\n[ "$1" = users ] && cat > "$RECORD.stdin"\nexit 0\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    record = tmp_path / "record"
    env = {"PATH": f"{fake.parent}:/usr/bin:/bin", "RECORD": str(record),
           "STRATALOG_ADMIN_PASSWORD": "pw with 'quotes' and $dollars"}
    subprocess.run(["sh", "-c", line], env=env, check=True, timeout=30)
    users = Path(f"{record}.users").read_text().splitlines()
    assert users == ["users", "add", "admin", "--password-file", "-", "--coordinator", "etcd://10.0.1.10:2379"]
    assert Path(f"{record}.stdin").read_text() == "pw with 'quotes' and $dollars"
    serve = Path(f"{record}.serve").read_text().splitlines()
    assert serve[:2] == ["serve", "--listen"] and "--broker-id" in serve and serve[serve.index("--broker-id") + 1] == "1"
    settings = [serve[i + 1] for i, a in enumerate(serve) if a == "--set"]
    assert settings == ["listeners=SASL_PLAINTEXT://0.0.0.0:9092",
                        "advertised.listeners=SASL_PLAINTEXT://kafka.example.internal:9093",
                        "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                        "super.users=User:admin"]
    assert shlex.split(line)[0] == "printf"  # one shell line of quoted words
    assert secret["change"]["after"]["name_prefix"].startswith("stratalog")
    assert "gateways_admin_secret_arn" in plan["output_changes"]


def test_sasl_ssl_without_a_certificate_is_refused_at_plan(tf_tree, tf_env, moto_url, tmp_path):
    proc = _tf_plan_failure(tf_tree / "examples/complete", tf_env,
                            {**_emulator_vars(moto_url), "etcd_existing_endpoints": ["10.0.1.10:2379"]}, tmp_path)
    assert "needs tls_certificate_arn" in proc
