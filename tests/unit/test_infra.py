"""infra/ works when applied: the compose file (rendered the way `docker compose config`
renders it: anchors, merge keys, `${VAR…}` interpolation, env_file) and the Kubernetes
manifests give every process the configuration its role needs and nothing it cannot use:

- every path a process's settings name is on a volume it mounts, and the model paths its
  engines and scorer need are set;
- every process runs an image (Dockerfile target) with the extras its settings need;
- every process works for one pinned run, and the fleet refuses to start without the pin;
- KEDA watches every queue of `ocrfleet.tasks.routing` on a Deployment that consumes it;
- Prometheus scrapes every metrics port of every replica (workers, their webhooks child,
  the scheduler, the API);
- alerts query metrics the code exports, and their summaries print the value the
  expression returns;
- every `ocrfleet` command line parses with the real CLI.

Also: every file parses, every OCRFLEET_* variable is a setting, and the compose file passes
`docker compose config` when that is installed. The systemd units start a fleet that
processes a document in tests/integration/test_infra_systemd.py."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import typer
import yaml

from ocrfleet.cli import app
from ocrfleet.config import Settings
from ocrfleet.tasks import routing
from ocrfleet.tasks.devices import Device
from ocrfleet.tasks.launcher import plan_children
from tests.conftest import REPO

INFRA = REPO / "infra"
KUBERNETES = INFRA / "kubernetes"
SYSTEMD = INFRA / "systemd"
YAML_FILES = sorted([*INFRA.rglob("*.yml"), *INFRA.rglob("*.yaml")])
JSON_FILES = sorted(INFRA.rglob("*.json"))
TEXT_FILES = sorted(p for p in INFRA.rglob("*") if p.is_file())
# What the operator sets before `docker compose up` (README, "Pinning the run").
PIN = "ab" * 32
COMPOSE_ENV = {"OCRFLEET_RUN_ID": PIN, "FLOWER_PASSWORD": "secret"}
# Where the systemd units' EnvironmentFile= paths come from.
SYSTEMD_ENV_FILES = {
    "/etc/ocrfleet/ocrfleet.env": SYSTEMD / "ocrfleet.env",
    "/etc/ocrfleet/gpu.env": INFRA / "env" / "gpu.env",
}
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
    "PIP_NO_CACHE_DIR": "pip (Dockerfile)",
    "DEBIAN_FRONTEND": "apt-get (Dockerfile)",
}


def documents(path: Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


# --- rendering ------------------------------------------------------------------------------

_VARIABLE = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")


class InterpolationError(ValueError):
    pass


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose's `${VAR}`, `${VAR:-default}`, `${VAR-default}`, `${VAR:?error}`,
    `${VAR?error}` and `$$`, in every string of `value`."""
    if isinstance(value, dict):
        return {key: interpolate(item, env) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate(item, env) for item in value]
    if not isinstance(value, str):
        return value

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, op, arg = match.groups()
        present = name in env and (env[name] != "" or not (op or "").startswith(":"))
        if present:
            return env[name]
        if op and op.endswith("?"):
            raise InterpolationError(f"{name}: {arg}")
        return arg if op else ""

    return _VARIABLE.sub(one, value)


def read_env_file(path: Path) -> dict[str, str]:
    found = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            found[key.strip()] = value.strip()
    return found


def render_compose(env: dict[str, str]) -> dict[str, Any]:
    """The compose file as `docker compose config` sees it: each service's environment is
    its env_file(s) overridden by `environment`."""
    raw = documents(INFRA / "docker-compose.yml")[0]
    compose = interpolate(raw, env)
    for service in compose["services"].values():
        merged: dict[str, str] = {}
        files = service.get("env_file") or []
        for name in [files] if isinstance(files, str) else files:
            merged |= read_env_file(INFRA / name)
        environment = service.get("environment") or {}
        if isinstance(environment, list):
            environment = dict(item.split("=", 1) for item in environment)
        merged |= {key: str(value) for key, value in environment.items()}
        service["environment"] = merged
    return compose


@dataclass
class Process:
    """One ocrfleet process as a deployment starts it."""

    where: str
    argv: list[str]  # after `ocrfleet`
    env: dict[str, str]
    target: str | None = None  # Dockerfile target; None: not an image (systemd)
    mounts: list[str] = field(default_factory=list)
    replicas: int = 1
    ports: dict[int, str] = field(default_factory=dict)  # containerPort -> name (k8s)

    def settings(self) -> Settings:
        values = {
            key.removeprefix("OCRFLEET_").lower(): value
            for key, value in self.env.items()
            if key.startswith("OCRFLEET_")
        }
        return Settings(_env_file=None, **values)  # type: ignore[call-arg]

    def option(self, name: str, default: str | None = None) -> str | None:
        return self.argv[self.argv.index(name) + 1] if name in self.argv else default


def image_target(image: str) -> str:
    match = re.fullmatch(r"ocrfleet-([a-z]+):[\w.-]+", image)
    assert match, f"{image}: ocrfleet images are ocrfleet-<Dockerfile target>:<tag>"
    return match.group(1)


def compose_processes(env: dict[str, str] | None = None) -> list[Process]:
    compose = render_compose(COMPOSE_ENV if env is None else env)
    found = []
    for name, service in compose["services"].items():
        image = str(service.get("image", ""))
        if not image.startswith("ocrfleet"):
            continue
        target = image_target(image)
        assert service["build"]["target"] == target, name
        mounts = [str(v).split(":")[1] for v in service.get("volumes") or []]
        found.append(
            Process(
                where=f"compose {name}",
                argv=[str(a) for a in service["command"]],
                env=service["environment"],
                target=target,
                mounts=mounts,
                replicas=int((service.get("deploy") or {}).get("replicas", 1)),
            )
        )
    return found


def kubernetes_docs() -> list[dict[str, Any]]:
    return [doc for path in sorted(KUBERNETES.glob("*.yaml")) for doc in documents(path)]


def _pod_spec(doc: dict[str, Any]) -> dict[str, Any] | None:
    if doc.get("kind") in ("Deployment", "Job"):
        return doc["spec"]["template"]["spec"]
    return None


def kubernetes_processes() -> list[Process]:
    docs = kubernetes_docs()
    sources = {
        (doc["kind"], doc["metadata"]["name"]): {
            **(doc.get("data") or {}),
            **(doc.get("stringData") or {}),
        }
        for doc in docs
        if doc["kind"] in ("ConfigMap", "Secret")
    }
    found = []
    for doc in docs:
        spec = _pod_spec(doc)
        if spec is None:
            continue
        for container in spec["containers"]:
            env: dict[str, str] = {}
            for source in container.get("envFrom", []):
                kind, ref = (
                    ("ConfigMap", source["configMapRef"])
                    if "configMapRef" in source
                    else ("Secret", source["secretRef"])
                )
                env |= sources[(kind, ref["name"])]
            env |= {item["name"]: str(item["value"]) for item in container.get("env", [])}
            if env.get("OCRFLEET_RUN_ID") == "CHANGE-ME":  # what the operator pins
                env["OCRFLEET_RUN_ID"] = PIN
            found.append(
                Process(
                    where=f"{doc['kind']} {doc['metadata']['name']}",
                    argv=[str(a) for a in container["args"]],
                    env=env,
                    target=image_target(container["image"]),
                    mounts=[m["mountPath"] for m in container.get("volumeMounts", [])],
                    replicas=int(doc["spec"].get("replicas", 1)),
                    ports={p["containerPort"]: p["name"] for p in container.get("ports", [])},
                )
            )
    return found


def systemd_processes() -> list[Process]:
    found = []
    for path in sorted(SYSTEMD.glob("*.service")):
        env: dict[str, str] = {}
        argv: list[str] = []
        for line in path.read_text().replace("%i", "0").splitlines():
            key, _, value = line.partition("=")
            if key == "EnvironmentFile":
                env |= read_env_file(SYSTEMD_ENV_FILES[value.removeprefix("-")])
            elif key == "Environment":
                name, _, setting = value.partition("=")
                env[name] = setting
            elif key == "ExecStart":
                argv = value.split()
                assert argv[0] == "/opt/ocrfleet/.venv/bin/ocrfleet", line
        if env.get("OCRFLEET_RUN_ID") == "CHANGE-ME":
            env["OCRFLEET_RUN_ID"] = PIN
        env["OCRFLEET_CACHE_DIR"] = env["OCRFLEET_CACHE_DIR"].replace("%C", "/var/cache")
        found.append(Process(where=path.name, argv=argv[1:], env=env))
    return found


def all_processes() -> list[Process]:
    return [*compose_processes(), *kubernetes_processes(), *systemd_processes()]


def dockerfile_extras() -> dict[str, set[str]]:
    """Dockerfile target -> the extras (and Debian packages) installed in it, its base's
    included."""
    stages: dict[str, set[str]] = {}
    current = None
    for line in (INFRA / "Dockerfile").read_text().replace("\\\n", " ").splitlines():
        if match := re.match(r"FROM (\S+) AS (\S+)", line):
            base, current = match.groups()
            stages[current] = set(stages.get(base, set()))
        elif line.startswith("RUN") and current:
            for extras in re.findall(r"\.\[([\w,]+)\]", line):
                stages[current] |= set(extras.split(","))
            if "install" in line and "ocrfleet" not in line:
                stages[current] |= set(re.findall(r"\b(tesseract-ocr|fonts-noto-cjk)\b", line))
    return stages


def needed_extras(process: Process) -> set[str]:
    """The extras (and Debian packages) a process's command and settings need."""
    needs = set()
    if process.argv[0] == "flower":
        needs.add("monitoring")
    if process.argv[0] == "worker" and "gpu" in (process.option("--queues", "gpu") or ""):
        settings = process.settings()
        if "minicpm" in settings.engines or settings.scorer == "jev":
            needs.add("models")
        if "tesseract" in settings.engines or settings.scorer == "consensus":
            needs |= {"tesseract", "tesseract-ocr"}  # consensus re-reads with tesseract
        if settings.scorer == "jev":
            needs.add("fonts-noto-cjk")  # the frozen renderer's font
    return needs


# --- every file, every variable, every command ----------------------------------------------


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


def test_every_other_variable_has_a_known_reader() -> None:
    keys = {key for process in all_processes() for key in process.env}
    compose = render_compose(COMPOSE_ENV)
    for service in compose["services"].values():
        keys |= set(service["environment"])
    dockerfile = (INFRA / "Dockerfile").read_text()
    keys |= set(re.findall(r"\b([A-Z][A-Z0-9_]+)=", dockerfile))
    assert "OCRFLEET_BROKER_URL" in keys
    assert {k for k in keys if not k.startswith("OCRFLEET_")} <= set(FOREIGN_ENV)


def test_every_command_parses_with_the_real_cli() -> None:
    root = typer.main.get_command(app)
    processes = all_processes()
    used = {process.argv[0] for process in processes}
    assert {"worker", "scheduler", "flower", "db", "api", "run-id"} <= used
    assert "beat" not in used  # the workers run the recovery sweeps
    for process in processes:
        command: Any = root
        args = list(process.argv)
        context = None
        # typer ships its own click: recognise a group by what it does.
        while hasattr(command, "get_command") and args and not args[0].startswith("-"):
            context = command.context_class(command, info_name=command.name, parent=context)
            sub = command.get_command(context, args[0])
            assert sub is not None, f"{process.where}: no command {args[0]!r}"
            command, args = sub, args[1:]
        try:
            command.make_context(command.name, args, parent=context)
        except Exception as exc:  # unknown options or bad values
            raise AssertionError(f"{process.where}: {' '.join(process.argv)}: {exc}") from exc


# --- configuration per role -----------------------------------------------------------------


def test_every_process_settings_load_and_name_only_mounted_paths() -> None:
    path_settings = {
        name for name, info in Settings.model_fields.items() if "Path" in str(info.annotation)
    }
    checked = 0
    for process in [*compose_processes(), *kubernetes_processes()]:
        settings = process.settings()
        if "minicpm" in settings.engines:
            assert settings.minicpm_model_path is not None, process.where
        if settings.scorer == "jev":
            assert settings.jev_model_path is not None, process.where
        for name in path_settings:
            if f"OCRFLEET_{name.upper()}" not in process.env:
                continue  # the image's default, or unused
            path = PurePosixPath(str(getattr(settings, name)))
            mounted = any(path.is_relative_to(mount) for mount in process.mounts)
            assert mounted, f"{process.where}: {name}={path} is on no volume it mounts"
            checked += 1
    assert checked >= 4  # model paths and Flower's state, at least


def test_only_device_workers_get_engine_and_model_settings() -> None:
    role_only = {"OCRFLEET_ENGINES", "OCRFLEET_SCORER", "OCRFLEET_MINICPM_MODEL_PATH"}
    role_only.add("OCRFLEET_JEV_MODEL_PATH")
    for process in all_processes():
        device_worker = process.argv[:1] == ["worker"] and process.option("--queues") == "gpu"
        computes_run = process.argv[:1] == ["run-id"]
        if not (device_worker or computes_run):
            assert not role_only & set(process.env), process.where


def test_every_image_has_the_extras_its_settings_need() -> None:
    stages = dockerfile_extras()
    assert {"client", "control", "gpu"} <= set(stages)
    assert "models" not in stages["client"] | stages["control"]  # no torch where unused
    checked = 0
    for process in [*compose_processes(), *kubernetes_processes()]:
        assert process.target in stages, process.where
        missing = needed_extras(process) - stages[process.target]
        assert missing == set(), f"{process.where}: image {process.target} lacks {missing}"
        checked += bool(needed_extras(process))
    assert checked >= 4  # device workers in compose and Kubernetes, Flower in both


def test_one_pinned_run_across_roles() -> None:
    for processes in (compose_processes(), kubernetes_processes(), systemd_processes()):
        long_running = [p for p in processes if p.argv[0] in ("worker", "api", "scheduler")]
        assert {p.env.get("OCRFLEET_RUN_ID") for p in long_running} == {PIN}
    # The pin is required: compose refuses to start without it, and no unit sets its own.
    with pytest.raises(InterpolationError, match="OCRFLEET_RUN_ID"):
        compose_processes({"FLOWER_PASSWORD": "secret"})
    for path in SYSTEMD.glob("*.service"):
        assert "OCRFLEET_RUN_ID" not in path.read_text(), path.name
    # Kubernetes: one ConfigMap holds it; the run-id Job computes it without it.
    holders = [
        doc["metadata"]["name"]
        for doc in kubernetes_docs()
        if "OCRFLEET_RUN_ID" in (doc.get("data") or {}) | (doc.get("stringData") or {})
    ]
    assert holders == ["ocrfleet-env"]
    (job,) = [p for p in kubernetes_processes() if p.argv[0] == "run-id"]
    assert "OCRFLEET_RUN_ID" not in job.env
    (worker,) = [p for p in kubernetes_processes() if p.option("--queues") == "gpu"]
    assert {k: v for k, v in job.env.items() if k != "OCRFLEET_RUN_ID"} == {
        k: v for k, v in worker.env.items() if k in job.env
    }
    assert job.mounts == worker.mounts and job.target == worker.target


# --- scaling and monitoring -----------------------------------------------------------------


def consumed_queues(process: Process) -> set[str]:
    """The queues an `ocrfleet worker` process's children consume (the real launcher plan)."""
    roles = (process.option("--queues", "gpu") or "").split(",")
    children = plan_children(
        roles,
        [Device("cuda", 0, "0")] if "gpu" in roles else [],
        concurrency=int(process.option("--concurrency", "1") or 1),
        webhook_threads=process.settings().webhook_concurrency,
    )
    return {q for c in children for q in c.argv[c.argv.index("--queues") + 1].split(",")}


def metrics_ports(process: Process) -> list[int]:
    """The ports a process serves /metrics on."""
    if process.argv[0] == "worker":
        base = process.settings().worker_health_port
        roles = (process.option("--queues", "gpu") or "").split(",")
        children = plan_children(
            roles,
            [Device("cuda", 0, "0")] if "gpu" in roles else [],
            webhook_threads=process.settings().webhook_concurrency,
        )
        return [base + slot for slot in range(len(children))] if base else []
    if process.argv[0] == "scheduler":
        return [process.settings().scheduler_metrics_port]
    if process.argv[0] == "api":
        return [int(process.option("--port", "8080") or 8080)]
    return []


def test_keda_watches_every_queue() -> None:
    docs = kubernetes_docs()
    scaled = {
        d["spec"]["scaleTargetRef"]["name"]: d["spec"] for d in docs if d["kind"] == "ScaledObject"
    }
    consumers: dict[str, list[str]] = {}
    for process in kubernetes_processes():
        if process.argv[0] == "worker":
            name = process.where.split()[1]
            for queue in consumed_queues(process):
                consumers.setdefault(queue, []).append(name)
    queues = [queue.name for queue in routing.task_queues()]
    assert {"gpu", "gpu.high", "ingest", "ingest.high", "webhooks"} <= set(queues)
    for queue in queues:
        assert consumers.get(queue), f"no Deployment consumes {queue}"
        watched = [
            name
            for name in consumers[queue]
            if any(
                t["type"] == "redis" and t["metadata"]["listName"] == queue
                for t in scaled.get(name, {}).get("triggers", [])
            )
        ]
        assert watched, queue  # the sweeps have no queue: the elected launcher runs them


def test_scheduler_never_wants_more_than_can_run() -> None:
    compose = compose_processes()
    (scheduler,) = [p for p in compose if p.argv[0] == "scheduler"]
    settings = scheduler.settings()
    gpus = [p for p in compose if p.option("--queues") == "gpu"]
    (ingest,) = [p for p in compose if p.option("--queues") == "ingest"]
    assert settings.scale_max_gpu == sum(p.replicas for p in gpus)
    assert settings.scale_max_ingest == ingest.replicas
    (scheduler,) = [p for p in kubernetes_processes() if p.argv[0] == "scheduler"]
    settings = scheduler.settings()
    for doc in kubernetes_docs():
        if doc["kind"] == "ScaledObject":
            role = doc["spec"]["scaleTargetRef"]["name"].removeprefix("ocrfleet-")
            assert doc["spec"]["maxReplicaCount"] == getattr(settings, f"scale_max_{role}")


def test_prometheus_scrapes_every_replica_of_compose() -> None:
    config = documents(INFRA / "prometheus" / "prometheus.yml")[0]
    every_replica: set[tuple[str, int]] = set()
    static: set[tuple[str, int]] = set()
    for job in config["scrape_configs"]:
        for sd in job.get("dns_sd_configs", []):
            every_replica |= {(name, sd["port"]) for name in sd["names"]}
        for group in job.get("static_configs", []):
            for target in group["targets"]:
                host, port = target.rsplit(":", 1)
                static.add((host, int(port)))
    checked = set()
    for process in compose_processes():
        name = process.where.split()[1]
        for port in metrics_ports(process):
            covered = (name, port) in every_replica or (
                process.replicas == 1 and (name, port) in static
            )
            assert covered, f"{process.where}: /metrics on {port} is not scraped"
            checked.add(process.argv[0])
    assert checked == {"worker", "scheduler", "api"}


def _relabel_keeps(rules: list[dict[str, Any]], labels: dict[str, str]) -> bool:
    for rule in rules:
        action = rule.get("action", "replace")
        if action not in ("keep", "drop"):
            continue
        value = rule.get("separator", ";").join(labels.get(s, "") for s in rule["source_labels"])
        matched = re.fullmatch(rule.get("regex", "(.*)"), value) is not None
        if matched != (action == "keep"):
            return False
    return True


def test_prometheus_scrapes_every_pod_of_kubernetes() -> None:
    config = documents(INFRA / "prometheus" / "kubernetes.yml")[0]
    pod_jobs = [
        job["relabel_configs"]
        for job in config["scrape_configs"]
        if any(sd["role"] == "pod" for sd in job.get("kubernetes_sd_configs", []))
    ]
    deployments = {d["metadata"]["name"]: d for d in kubernetes_docs() if d["kind"] == "Deployment"}
    checked = set()
    for process in kubernetes_processes():
        name = process.where.split()[1]
        if name not in deployments:
            continue  # Jobs
        template = deployments[name]["spec"]["template"]["metadata"]
        for port in metrics_ports(process):
            assert port in process.ports, f"{process.where}: no containerPort {port}"
            labels = {
                "__meta_kubernetes_pod_container_port_name": process.ports[port],
                "__meta_kubernetes_pod_container_port_number": str(port),
            }
            for key, value in (template.get("annotations") or {}).items():
                labels[f"__meta_kubernetes_pod_annotation_{re.sub(r'[^a-z0-9]', '_', key)}"] = value
            for key, value in template["labels"].items():
                labels[f"__meta_kubernetes_pod_label_{re.sub(r'[^a-z0-9]', '_', key)}"] = value
            kept = [rules for rules in pod_jobs if _relabel_keeps(rules, labels)]
            assert len(kept) == 1, f"{process.where}: port {port} scraped by {len(kept)} jobs"
            checked.add(process.argv[0])
    assert checked == {"worker", "scheduler", "api"}


def test_every_metric_queried_is_exported_by_the_code() -> None:
    source = "\n".join(p.read_text() for p in (REPO / "ocrfleet").rglob("*.py"))
    queried = set()
    sources = [*(INFRA / "prometheus").glob("*.yml"), *JSON_FILES, KUBERNETES / "keda.yaml"]
    for path in sources:
        queried |= set(re.findall(r"\bocrfleet_[a-z_]+[a-z]\b", path.read_text()))
    assert len(queried) >= 10
    # A counter is exported with `_total` whether or not its name in the code has it.
    names = {n: {n, re.sub(r"_(bucket|count|sum|total)$", "", n)} for n in queried}
    missing = {n for n, forms in names.items() if not any(f'"{f}"' in source for f in forms)}
    assert missing == set()


def _value_kind(expr: str) -> str:
    """What the value of `LHS <comparison> RHS` is: the LHS's, by its shape."""
    left = re.split(r"\s(?:>|<|==|!=|>=|<=)\s", expr.split(" or ")[0], maxsplit=1)[0]
    if " / " in left:
        return "ratio"
    if " - " in left:
        return "difference"
    return "seconds" if re.search(r"_seconds\b", left) else "count"


def test_alert_summaries_print_the_value_the_expression_returns() -> None:
    (rules_file,) = documents(INFRA / "prometheus" / "alerts.yml")
    rules = {r["alert"]: r for group in rules_file["groups"] for r in group["rules"]}
    assert {
        "OcrfleetOldestPageOverSLO",
        "OcrfleetWorkerDown",
        "OcrfleetReviewRateJump",
        "OcrfleetFailureRateJump",
        "OcrfleetSchedulerDesiredNotActual",
    } <= set(rules)
    # Fewer live workers than wanted: more is a scale-down in progress or KEDA's floor.
    desired = rules["OcrfleetSchedulerDesiredNotActual"]
    assert desired["for"] == "10m" and "!=" not in desired["expr"]
    assert all(rule["expr"] and rule["for"] for rule in rules.values())
    printed = 0
    for name, rule in rules.items():
        summary = rule["annotations"]["summary"]
        if "$value" not in summary:
            continue
        printed += 1
        kind = _value_kind(" ".join(rule["expr"].split()))
        if "humanizeDuration" in summary:
            assert kind == "seconds", name
        elif "humanizePercentage" in summary:
            assert kind == "ratio", name
        else:
            assert kind in ("count", "difference"), name
        if re.search(r"\b(more|fewer|less)\b", summary):
            assert kind in ("difference", "ratio"), f"{name}: a plain value is no difference"
    assert printed >= 4


# --- structure ------------------------------------------------------------------------------


def test_compose_structure() -> None:
    compose = render_compose(COMPOSE_ENV)
    services = compose["services"]
    assert {"redis", "postgres", "minio", "ingest", "scheduler", "api", "flower"} <= set(services)
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


def test_compose_config_accepts_the_file() -> None:
    env = {**COMPOSE_ENV, "PATH": "/usr/local/bin:/usr/bin:/bin"}
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
    docs = kubernetes_docs()
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
    assert scaled["triggers"][0]["type"] == "prometheus"
    assert "ocrfleet_scheduler_desired_workers" in scaled["triggers"][0]["metadata"]["query"]
    assert ("PodDisruptionBudget", "ocrfleet-gpu") in by_name
    for doc in docs:
        spec = _pod_spec(doc) or {"containers": []}
        for container in spec["containers"]:
            for port in container.get("ports", []):  # IANA_SVC_NAME, or the apply fails
                assert re.fullmatch(r"[a-z0-9]([a-z0-9-]{0,13}[a-z0-9])?", port["name"]), port


def test_systemd_units_use_distinct_ports_and_known_env_files() -> None:
    ports: dict[int, str] = {}
    for process in systemd_processes():
        for port in metrics_ports(process):
            assert port not in ports, (process.where, ports.get(port))
            ports[port] = process.where
    for path in SYSTEMD.glob("*.service"):
        files = re.findall(r"^EnvironmentFile=-?(\S+)", path.read_text(), re.M)
        assert files and set(files) <= set(SYSTEMD_ENV_FILES), path.name
    assert os.path.exists(SYSTEMD / "ocrfleet.target")
