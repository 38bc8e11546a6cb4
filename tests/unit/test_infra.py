"""infra/ stays true to the code: every file parses, every OCRFLEET_* variable is a
setting, every `ocrfleet` command line parses with the real CLI, every metric it queries is
one the code exports, and the compose file passes `docker compose config` (or
`docker-compose config`) when either is installed, and a structural check always."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from ocrfleet.cli import app
from ocrfleet.config import Settings
from tests.conftest import REPO

INFRA = REPO / "infra"
YAML_FILES = sorted([*INFRA.rglob("*.yml"), *INFRA.rglob("*.yaml")])
JSON_FILES = sorted(INFRA.rglob("*.json"))
TEXT_FILES = sorted(p for p in INFRA.rglob("*") if p.is_file())
# Variables of other programs the infra files set, and who reads them.
FOREIGN_ENV = {
    "AWS_ACCESS_KEY_ID": "boto3",
    "AWS_SECRET_ACCESS_KEY": "boto3",
    "AWS_DEFAULT_REGION": "boto3",
    "POSTGRES_USER": "postgres image",
    "POSTGRES_PASSWORD": "postgres image",
    "POSTGRES_DB": "postgres image",
    "MINIO_ROOT_USER": "minio image",
    "MINIO_ROOT_PASSWORD": "minio image",
}


def documents(path: Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def test_every_yaml_and_json_file_parses() -> None:
    assert len(YAML_FILES) >= 10 and JSON_FILES
    for path in YAML_FILES:
        assert documents(path), path
    for path in JSON_FILES:
        json.loads(path.read_text())


def test_every_ocrfleet_variable_is_a_setting() -> None:
    fields = set(Settings.model_fields)
    named = set()
    for path in TEXT_FILES:
        named |= set(re.findall(r"\bOCRFLEET_[A-Z0-9_]+[A-Z0-9]\b", path.read_text()))
    assert named
    unknown = {name for name in named if name.removeprefix("OCRFLEET_").lower() not in fields}
    assert unknown == set()


def _env_keys() -> set[str]:
    compose = documents(INFRA / "docker-compose.yml")[0]
    keys: set[str] = set()
    for service in compose["services"].values():
        env = service.get("environment") or {}
        keys |= set(env) if isinstance(env, dict) else {e.split("=")[0] for e in env}
    for path in (INFRA / "kubernetes").glob("*.yaml"):
        for doc in documents(path):
            if doc["kind"] in ("ConfigMap", "Secret"):
                keys |= set(doc.get("data") or {}) | set(doc.get("stringData") or {})
            for container in _containers(doc):
                keys |= {e["name"] for e in container.get("env", [])}
    return keys


def test_every_other_variable_has_a_known_reader() -> None:
    keys = _env_keys()
    assert "OCRFLEET_BROKER_URL" in keys
    assert {k for k in keys if not k.startswith("OCRFLEET_")} <= set(FOREIGN_ENV)


def _containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    if doc.get("kind") != "Deployment":
        return []
    return doc["spec"]["template"]["spec"]["containers"]


def command_lines() -> list[tuple[str, list[str]]]:
    """(where, argv after `ocrfleet`) of every ocrfleet command in infra/."""
    found = []
    compose = documents(INFRA / "docker-compose.yml")[0]
    for name, service in compose["services"].items():
        if str(service.get("image", "")).startswith("ocrfleet") and "command" in service:
            found.append((f"compose {name}", [str(a) for a in service["command"]]))
    for path in (INFRA / "kubernetes").glob("*.yaml"):
        for doc in documents(path):
            for container in _containers(doc):
                found.append((f"{path.name} {doc['metadata']['name']}", container["args"]))
    for path in (INFRA / "systemd").glob("*.service"):
        for line in path.read_text().splitlines():
            if line.startswith("ExecStart="):
                argv = line.removeprefix("ExecStart=").replace("%i", "0").split()
                assert argv[0].endswith("/ocrfleet"), line
                found.append((path.name, argv[1:]))
    return found


def test_every_command_parses_with_the_real_cli() -> None:
    root = typer.main.get_command(app)
    lines = command_lines()
    used = {argv[0] for _, argv in lines}
    checked: set[str] = set()
    assert {"worker", "scheduler", "beat", "flower", "db"} <= used
    for where, argv in lines:
        command: Any = root
        args = list(argv)
        context = None
        # typer ships its own click: recognise a group by what it does.
        while hasattr(command, "get_command") and args and not args[0].startswith("-"):
            context = command.context_class(command, info_name=command.name, parent=context)
            sub = command.get_command(context, args[0])
            assert sub is not None, f"{where}: no command {args[0]!r}"
            command, args = sub, args[1:]
        try:
            command.make_context(command.name, args, parent=context)
        except Exception as exc:  # unknown options or bad values
            raise AssertionError(f"{where}: ocrfleet {' '.join(argv)}: {exc}") from exc
        checked.add(where)
    assert len(checked) == len(lines)


def test_every_metric_queried_is_exported_by_the_code() -> None:
    source = "\n".join(p.read_text() for p in (REPO / "ocrfleet").rglob("*.py"))
    queried = set()
    sources = [*(INFRA / "prometheus").glob("*.yml"), *JSON_FILES, INFRA / "kubernetes/keda.yaml"]
    for path in sources:
        queried |= set(re.findall(r"\bocrfleet_[a-z_]+[a-z]\b", path.read_text()))
    assert len(queried) >= 10
    bare = {name: re.sub(r"_(bucket|count|sum)$", "", name) for name in queried}
    missing = {n for n in queried if f'"{n}"' not in source and f'"{bare[n]}"' not in source}
    assert missing == set()


def test_compose_structure() -> None:
    compose = documents(INFRA / "docker-compose.yml")[0]
    services = compose["services"]
    assert {"redis", "postgres", "minio", "ingest", "scheduler", "beat", "flower"} <= set(services)
    assert {"prometheus", "grafana"} <= set(services)
    assert "--appendonly" in services["redis"]["command"]
    for name, service in services.items():
        assert "image" in service or "build" in service, name
        for dependency in service.get("depends_on") or {}:
            assert dependency in services, (name, dependency)
        for volume in service.get("volumes") or []:
            source = str(volume).split(":")[0]
            if not source.startswith((".", "/")):
                assert source in compose["volumes"], (name, volume)
    gpus = {
        name: service["deploy"]["resources"]["reservations"]["devices"]
        for name, service in services.items()
        if "reservations" in (service.get("deploy") or {}).get("resources", {})
    }
    assert len(gpus) >= 2
    ids = [d[0]["device_ids"] for d in gpus.values()]
    assert all(len(i) == 1 for i in ids) and len({i[0] for i in ids}) == len(ids)
    limit = Settings(_env_file=None).task_time_limit  # type: ignore[call-arg]
    for name in gpus:
        assert int(services[name]["stop_grace_period"].rstrip("s")) > limit


def test_compose_config_accepts_the_file(tmp_path: Path) -> None:
    env = {"OCRFLEET_FLOWER_BASIC_AUTH": "ops:secret", "PATH": "/usr/local/bin:/usr/bin:/bin"}
    candidates = [["docker", "compose"], ["docker-compose"]]
    for tool in candidates:
        if not shutil.which(tool[0]):
            continue
        probe = subprocess.run([*tool, "version"], capture_output=True, text=True, timeout=60)
        if probe.returncode != 0:  # `docker` without the compose plugin
            continue
        done = subprocess.run(
            [*tool, "-f", str(INFRA / "docker-compose.yml"), "config", "--quiet"],
            cwd=INFRA,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return
    pytest.skip("neither `docker compose` nor `docker-compose` is installed")


def test_kubernetes_workers_keda_and_pdb() -> None:
    docs = [doc for path in (INFRA / "kubernetes").glob("*.yaml") for doc in documents(path)]
    by_name = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    gpu = by_name[("Deployment", "ocrfleet-gpu")]["spec"]["template"]["spec"]
    (container,) = gpu["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    limit = Settings(_env_file=None).task_time_limit  # type: ignore[call-arg]
    assert gpu["terminationGracePeriodSeconds"] > limit
    scaled = by_name[("ScaledObject", "ocrfleet-gpu")]["spec"]
    assert scaled["scaleTargetRef"]["name"] == "ocrfleet-gpu"
    assert [t["type"] for t in scaled["triggers"]] == ["prometheus", "redis"]
    assert "ocrfleet_scheduler_desired_workers" in scaled["triggers"][0]["metadata"]["query"]
    assert ("PodDisruptionBudget", "ocrfleet-gpu") in by_name


def test_alert_rules() -> None:
    (rules_file,) = documents(INFRA / "prometheus" / "alerts.yml")
    rules = {r["alert"]: r for group in rules_file["groups"] for r in group["rules"]}
    assert {
        "OcrfleetOldestPageOverSLO",
        "OcrfleetWorkerDown",
        "OcrfleetReviewRateJump",
        "OcrfleetFailureRateJump",
        "OcrfleetSchedulerDesiredNotActual",
    } <= set(rules)
    assert rules["OcrfleetSchedulerDesiredNotActual"]["for"] == "10m"
    assert all(rule["expr"] and rule["for"] for rule in rules.values())
