"""Every configuration shipped under deploy/ is valid, and the Ray example's files agree.

ray-host.toml (the daemon's config) and ray-cluster.yaml (the KubeRay manifest) name the
same things: the head's Service and port, the workers and their CPUs, the vLLM replicas,
the image and its extras. A change to one that the other does not follow fails here.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from runtime.base.config import Config, load_config
from runtime.cli import main
from runtime.cluster import worker_specs

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CONFIGS = sorted(DEPLOY.glob("*.toml"))


def test_deploy_has_configs() -> None:
    assert {p.name for p in CONFIGS} >= {"gpu-host.toml", "cpu-demo.toml", "ray-host.toml"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_check_passes(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "check", str(path)]) == 0
    assert capsys.readouterr().out.strip() == f"ok: {path}"


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_no_shipped_config_holds_a_token(path: Path) -> None:
    """A placeholder like `token = "change-me"` ends up deployed; tokens come from
    `token_env` or `token_file`."""
    endpoint = load_config(path).endpoint
    assert endpoint.token == "", path


def test_the_gpu_host_reads_its_token_from_the_environment() -> None:
    endpoint = load_config(DEPLOY / "gpu-host.toml").endpoint
    assert endpoint.host == "0.0.0.0" and endpoint.token_env == "WEBAGENT_TOKEN"
    compose = (DEPLOY / "compose.gpu.yaml").read_text()
    assert "WEBAGENT_TOKEN: ${WEBAGENT_TOKEN:?" in compose


def test_the_cpu_demo_is_the_embedded_default_written_out() -> None:
    """cpu-demo.toml says `webagent train` with no config uses its values: it does."""
    demo = load_config(DEPLOY / "cpu-demo.toml")
    default = Config()
    assert demo.daemon.run_dir != default.daemon.run_dir  # its own run directory
    for section in ("sites", "browser", "policy", "scheduler", "learner", "endpoint"):
        assert getattr(demo, section) == getattr(default, section), section
    assert demo.daemon.data_dir == default.daemon.data_dir


# --------------------------------------------------------------------------- the Ray example


def _manifest() -> dict[str, dict[str, Any]]:
    """ray-cluster.yaml's documents by kind and name: {"RayCluster/webagent": ...}."""
    yaml = pytest.importorskip("yaml")  # PyYAML comes with the ray extra
    docs = list(yaml.safe_load_all((DEPLOY / "ray-cluster.yaml").read_text()))
    return {f"{d['kind']}/{d['metadata']['name']}": d for d in docs}


def _containers(pod_spec: dict[str, Any]) -> list[dict[str, Any]]:
    return list(pod_spec["spec"]["containers"])


def test_the_ray_host_config_deals_out_its_instances_and_fills_its_workers() -> None:
    config = load_config(DEPLOY / "ray-host.toml")
    cluster, scheduler = config.cluster, config.scheduler
    assert cluster.backend == "ray"
    assert len(cluster.replica_urls) == 2
    assert config.policy.url == ""  # the policy stack refuses policy.url beside replicas
    # Every worker gets WebArena instances of its own, none shared.
    specs = worker_specs(config, server_urls=cluster.replica_urls)
    names = [[i.name for i in spec.config.sites.instances] for spec in specs]
    assert len(specs) == cluster.workers and all(names)
    flat = [name for per_worker in names for name in per_worker]
    assert sorted(flat) == sorted(i.name for i in config.sites.instances)
    # A group runs on one worker; the groups in flight fill every context.
    assert cluster.contexts_per_worker % scheduler.group_size == 0
    episodes = scheduler.max_groups_in_flight * scheduler.group_size
    assert episodes == cluster.workers * cluster.contexts_per_worker
    # The driver runs no evaluations on instances the workers lease (RAY.md).
    assert config.daemon.eval_every == 0


def test_the_ray_manifest_matches_the_ray_host_config() -> None:
    config = load_config(DEPLOY / "ray-host.toml")
    docs = _manifest()
    ray_cluster = docs["RayCluster/webagent"]
    assert ray_cluster["apiVersion"] == "ray.io/v1"
    spec = ray_cluster["spec"]
    # cluster.address is the head Service KubeRay makes ("<name>-head-svc") and its
    # Ray Client port, which the head container declares.
    head = spec["headGroupSpec"]
    client_ports = [
        p["containerPort"]
        for c in _containers(head["template"])
        for p in c.get("ports", [])
        if p.get("name") == "client"
    ]
    address = f"ray://{ray_cluster['metadata']['name']}-head-svc:{client_ports[0]}"
    assert config.cluster.address == address
    assert head["rayStartParams"]["num-cpus"] == "0"  # no worker on the head
    # One rollout pod per worker, offering exactly the CPUs a worker reserves.
    (rollout,) = [g for g in spec["workerGroupSpecs"] if g["groupName"] == "rollout"]
    assert rollout["replicas"] == rollout["minReplicas"] == rollout["maxReplicas"]
    assert rollout["replicas"] == config.cluster.workers
    assert float(rollout["rayStartParams"]["num-cpus"]) == config.cluster.cpus_per_worker
    # KubeRay probes Ray 2.53+ over HTTP; older Ray needs wget, which the image lacks.
    major, minor = (int(x) for x in spec["rayVersion"].split(".")[:2])
    assert (major, minor) >= (2, 53)
    # The replicas: a StatefulSet behind a headless Service, one URL per pod.
    vllm = docs["StatefulSet/vllm"]["spec"]
    service = docs[f"Service/{vllm['serviceName']}"]["spec"]
    assert service["clusterIP"] == "None"
    port = service["ports"][0]["port"]
    urls = [f"http://vllm-{i}.{vllm['serviceName']}:{port}" for i in range(vllm["replicas"])]
    assert config.cluster.replica_urls == urls
    args = _containers(vllm["template"])[0]["args"]
    assert f"--max-lora-rank={config.learner.lora_rank}" in args
    assert f"--max-model-len={config.policy.max_model_len}" in args
    # The driver: this config, its token from the variable the config names.
    (driver,) = _containers(docs["Deployment/webagent-driver"]["spec"]["template"])
    assert driver["args"] == ["train", "--config", "/etc/webagent/config.toml"]
    assert config.endpoint.token_env in {e["name"] for e in driver["env"]}


def test_the_ray_pods_share_one_image_and_the_runs_volume() -> None:
    config = load_config(DEPLOY / "ray-host.toml")
    docs = _manifest()
    spec = docs["RayCluster/webagent"]["spec"]
    head = _containers(spec["headGroupSpec"]["template"])
    workers = [c for g in spec["workerGroupSpecs"] for c in _containers(g["template"])]
    driver = _containers(docs["Deployment/webagent-driver"]["spec"]["template"])
    vllm = _containers(docs["StatefulSet/vllm"]["spec"]["template"])
    # Head, workers and driver run one image: one Ray version everywhere.
    assert len({c["image"] for c in head + workers + driver}) == 1
    # The task file, auth states and adapters are read at the same path everywhere.
    for container in workers + driver + vllm:
        mounts = {m["mountPath"] for m in container["volumeMounts"] if "subPath" not in m}
        assert "/runs" in mounts, container["name"]
    for path in (config.sites.tasks, config.sites.auth_dir, config.daemon.run_dir):
        assert path.startswith("/runs/"), path


def test_the_ray_image_is_built_with_extras_that_exist() -> None:
    """The build command in ray-cluster.yaml names extras of pyproject.toml, and the
    Dockerfile installs what EXTRAS names."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    (named,) = re.findall(r"--build-arg EXTRAS=(\S+)", (DEPLOY / "ray-cluster.yaml").read_text())
    assert set(named.split(",")) == {"gpu", "ray"}
    assert set(named.split(",")) <= set(extras)
    assert 'pip install ".[${EXTRAS}]"' in (DEPLOY / "Dockerfile").read_text()
