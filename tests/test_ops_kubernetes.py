"""ops/kubernetes: every manifest against the Kubernetes schemas (offline), and their wiring."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from asyncgraph.client.ipconfig import IpConfig

ROOT = Path(__file__).resolve().parent.parent
MANIFESTS = sorted((ROOT / "ops" / "kubernetes").glob("*.yaml"))


def load_all() -> dict[tuple[str, str], dict[str, Any]]:
    docs: dict[tuple[str, str], dict[str, Any]] = {}
    for path in MANIFESTS:
        for doc in yaml.safe_load_all(path.read_text()):
            docs[(doc["kind"], doc["metadata"]["name"])] = doc
    return docs


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_validates_against_kubernetes_schema(path: Path) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")  # bundles the schemas: no network
    for doc in yaml.safe_load_all(path.read_text()):
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


def test_headless_service_implies_the_ip_config() -> None:
    docs = load_all()
    sts = docs[("StatefulSet", "asyncgraph-server")]
    svc = docs[("Service", sts["spec"]["serviceName"])]
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"] == sts["spec"]["template"]["metadata"]["labels"]
    port = svc["spec"]["ports"][0]["port"]
    implied = "".join(
        f"{sts['metadata']['name']}-{p}.{svc['metadata']['name']} {port}\n"
        for p in range(sts["spec"]["replicas"])
    )
    shipped = docs[("ConfigMap", "asyncgraph-ip-config")]["data"]["ip_config.txt"]
    assert shipped == implied
    assert IpConfig.parse(shipped).dump() == implied  # asyncgraph reads it as written


def test_server_and_trainer_wiring() -> None:
    docs = load_all()
    sts = docs[("StatefulSet", "asyncgraph-server")]
    pod = sts["spec"]["template"]["spec"]
    server = pod["containers"][0]
    script = server["args"][0]
    # part id = pod ordinal, from the pod name
    assert '--part-id "${POD_NAME##*-}"' in script
    assert server["env"][0]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert "--port 30050" in script and server["ports"][0]["containerPort"] == 30050
    # probes run the real handshake with the mounted secret
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        command = server[probe]["exec"]["command"]
        assert command[:3] == ["python", "-m", "asyncgraph.launch.health"]
        assert "/etc/asyncgraph/secret" in command
    secret_vol = next(v for v in pod["volumes"] if v["name"] == "secret")
    assert secret_vol["secret"]["defaultMode"] == 0o400
    assert "--secret-file /etc/asyncgraph/secret" in script
    graphs = next(v for v in pod["volumes"] if v["name"] == "graphs")
    assert (
        graphs["persistentVolumeClaim"]["claimName"]
        == docs[("PersistentVolumeClaim", "asyncgraph-graphs")]["metadata"]["name"]
    )
    # trainers: indexed Job, torchrun, world size = servers' --num-clients
    job = docs[("Job", "asyncgraph-trainer")]
    assert job["spec"]["completionMode"] == "Indexed"
    trainer = job["spec"]["template"]["spec"]["containers"][0]
    run = trainer["args"][0]
    nnodes = int(re.search(r"--nnodes (\d+)", run).group(1))  # type: ignore[union-attr]
    nproc = int(re.search(r"--nproc-per-node (\d+)", run).group(1))  # type: ignore[union-attr]
    assert run.startswith("exec torchrun") and '--node-rank "$JOB_COMPLETION_INDEX"' in run
    assert nnodes == job["spec"]["completions"] == job["spec"]["parallelism"]
    num_clients = int(re.search(r"--num-clients (\d+)", script).group(1))  # type: ignore[union-attr]
    assert num_clients == nnodes * nproc
    env = {e["name"]: e["value"] for e in trainer["env"]}
    assert env["ASYNCGRAPH_IP_CONFIG"] == "/etc/asyncgraph-ip/ip_config.txt"
    assert env["ASYNCGRAPH_SECRET_FILE"] == "/etc/asyncgraph/secret"
    subdomain = job["spec"]["template"]["spec"]["subdomain"]
    assert f"--master-addr {job['metadata']['name']}-0.{subdomain}" in run
    assert docs[("Service", subdomain)]["spec"]["clusterIP"] == "None"
