"""docker-compose.yml: valid against the Compose Specification and consistent with the app."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from app.settings import Settings
from tests.deploy.conftest import REPO

SCHEMA = Path(__file__).parent / "compose-spec.json"
SETTINGS_VARIABLES = {f"TWINWATCH_{name.upper()}" for name in Settings.model_fields}


def defaults(value: str) -> str:
    """`value` with each `${VARIABLE:-default}` as Compose reads it when VARIABLE is unset."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", value)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    return document


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        return dict(item.split("=", 1) for item in env)
    return {key: str(value) for key, value in env.items()}


def test_valid_against_the_compose_specification(compose: dict[str, Any]) -> None:
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft7Validator.check_schema(schema)  # the schema says draft-07
    jsonschema.Draft7Validator(schema).validate(compose)


def test_the_schema_check_catches_a_broken_file(compose: dict[str, Any]) -> None:
    schema = json.loads(SCHEMA.read_text())
    broken = json.loads(json.dumps(compose))
    broken["services"]["app"]["depends_on"]["postgres"]["condition"] = "service_ready"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(schema).validate(broken)


def test_the_services_of_the_deployment(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == {"app", "postgres", "prometheus", "twin", "grafana"}
    assert set(compose["volumes"]) >= {"postgres-data"}


def test_every_twinwatch_variable_is_a_setting(compose: dict[str, Any]) -> None:
    set_anywhere = {
        name
        for service in compose["services"].values()
        for name in environment(service)
        if name.startswith("TWINWATCH_")
    }
    dockerfile = (REPO / "Dockerfile").read_text()
    set_anywhere |= set(re.findall(r"\b(TWINWATCH_[A-Z_]+)=", dockerfile))
    assert set_anywhere, "no TWINWATCH_ variable found: the test reads the wrong place"
    unknown = sorted(set_anywhere - SETTINGS_VARIABLES)
    assert not unknown, f"not settings of app.settings.Settings: {unknown}"


def test_the_app_runs_on_postgresql_with_the_models_mounted(compose: dict[str, Any]) -> None:
    app = compose["services"]["app"]
    env = environment(app)
    postgres = environment(compose["services"]["postgres"])
    url = env["TWINWATCH_DATABASE_URL"]
    assert url.startswith("postgresql+psycopg://") and "@postgres:5432/" in url
    assert url.endswith("/" + postgres["POSTGRES_DB"])
    assert f"//{postgres['POSTGRES_USER']}:" in url
    models = env["TWINWATCH_MODELS_DIR"]
    assert any(v.split(":")[1] == models for v in app["volumes"] if v.startswith("./models:"))


def test_depends_on_waits_for_health_and_every_dependency_has_a_check(
    compose: dict[str, Any],
) -> None:
    services = compose["services"]
    edges = 0
    for name, service in services.items():
        for dependency, condition in service.get("depends_on", {}).items():
            edges += 1
            assert condition == {"condition": "service_healthy"}, (name, dependency)
            check = services[dependency].get("healthcheck", {})
            assert check and not check.get("disable"), f"{dependency} has no health check"
    assert edges >= 4


def test_bind_mounts_exist_in_the_repository(compose: dict[str, Any]) -> None:
    for service in compose["services"].values():
        for volume in service.get("volumes", []):
            source = defaults(volume).split(":")[0]
            if source.startswith("./"):
                assert (REPO / source).exists(), source


def test_prometheus_scrapes_the_app_where_it_listens(compose: dict[str, Any]) -> None:
    config = yaml.safe_load((REPO / "deploy/prometheus/prometheus.yml").read_text())
    (job,) = [job for job in config["scrape_configs"] if job["job_name"] == "twinwatch"]
    targets = [t for group in job["static_configs"] for t in group["targets"]]
    port = environment(compose["services"]["app"])["TWINWATCH_PORT"]
    assert targets == [f"app:{port}"]
    mounts = {defaults(v).split(":")[1] for v in compose["services"]["prometheus"]["volumes"]}
    for rule_file in config["rule_files"]:
        assert f"/etc/prometheus/{rule_file}" in mounts


def test_the_twin_posts_to_the_app_with_the_same_token(compose: dict[str, Any]) -> None:
    twin = compose["services"]["twin"]
    command = twin["command"]
    assert command[0] == "twin"
    port = environment(compose["services"]["app"])["TWINWATCH_PORT"]
    assert command[command.index("--url") + 1] == f"http://app:{port}"
    app_token = environment(compose["services"]["app"])["TWINWATCH_API_TOKEN"]
    assert environment(twin)["TWINWATCH_API_TOKEN"] == app_token


def test_grafana_is_provisioned_from_the_repository(compose: dict[str, Any]) -> None:
    grafana = compose["services"]["grafana"]
    mounts = dict(v.split(":")[:2] for v in grafana["volumes"] if v.startswith("./"))
    provider = yaml.safe_load(
        (REPO / "deploy/grafana/provisioning/dashboards/twinwatch.yml").read_text()
    )
    assert mounts["./deploy/grafana/dashboards"] == provider["providers"][0]["options"]["path"]
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    datasource = yaml.safe_load(
        (REPO / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text()
    )
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"


def test_published_ports_are_loopback_only(compose: dict[str, Any]) -> None:
    for service in compose["services"].values():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), port


def test_the_ci_override_only_swaps_images(compose: dict[str, Any]) -> None:
    """deploy/compose.ci.yml (deploy/container-check.sh's stack) replaces the images no registry
    serves there and nothing else users run: no list is overridden (podman-compose appends
    lists where the specification replaces them), so the stack CI starts is this file's."""
    override = yaml.safe_load((REPO / "deploy/compose.ci.yml").read_text())
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft7Validator(schema).validate(override)
    assert set(override["services"]) <= set(compose["services"]) - {"grafana"}
    for name, service in override["services"].items():
        assert set(service) <= {"image", "restart"}, name
        assert service["image"].startswith("localhost/twinwatch"), name


def test_the_app_keeps_its_data_in_a_named_volume(compose: dict[str, Any]) -> None:
    """Model versions' artifacts live under the data directory: kept like the database."""
    assert "app-data:/var/lib/twinwatch" in compose["services"]["app"]["volumes"]
    assert "app-data" in compose["volumes"]


@pytest.fixture(scope="module")
def bus() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.bus.yml").read_text())
    return document


def test_the_bus_override_runs_workers_beside_the_app(
    compose: dict[str, Any], bus: dict[str, Any]
) -> None:
    """docker-compose.bus.yml: NATS with JetStream on a volume, the app publishing to it, and
    workers of the app's image on the app's database and models; Prometheus finds every worker
    by the service's name; the CI override swaps images only."""
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft7Validator(schema).validate(bus)
    services = bus["services"]
    assert "--jetstream" in services["nats"]["command"]
    assert environment(services["app"])["TWINWATCH_BUS_URL"] == "nats://nats:4222"
    worker = services["worker"]
    assert worker["command"][:1] == ["worker"]
    port = worker["command"][worker["command"].index("--metrics-port") + 1]
    app = environment(compose["services"]["app"])
    for name, value in environment(worker).items():
        assert name in SETTINGS_VARIABLES, name
        if name in app:
            assert value == app[name], name
    assert set(worker["volumes"]) == set(compose["services"]["app"]["volumes"])
    for service in services.values():
        for dependency, condition in service.get("depends_on", {}).items():
            assert condition == {"condition": "service_healthy"}, dependency
    config = yaml.safe_load((REPO / "deploy/prometheus/prometheus.yml").read_text())
    (job,) = [job for job in config["scrape_configs"] if job["job_name"] == "twinwatch-workers"]
    assert job["dns_sd_configs"] == [
        {"names": ["worker"], "type": "A", "port": int(port), "refresh_interval": "15s"}
    ]
    ci = yaml.safe_load((REPO / "deploy/compose.bus.ci.yml").read_text())
    for name, service in ci["services"].items():
        assert name in services and set(service) == {"image"}, name
        assert service["image"].startswith("localhost/twinwatch"), name


def test_the_mqtt_override_puts_a_broker_between_the_twin_and_the_app(
    compose: dict[str, Any],
) -> None:
    """docker-compose.mqtt.yml: a persistent Mosquitto with room for a service away, the app
    subscribed to it, and the twin publishing there the run it posts without it."""
    document = yaml.safe_load((REPO / "docker-compose.mqtt.yml").read_text())
    jsonschema.Draft7Validator(json.loads(SCHEMA.read_text())).validate(document)
    services = document["services"]
    assert environment(services["app"])["TWINWATCH_MQTT_URL"] == "mqtt://mosquitto:1883"
    twin = services["twin"]["command"]
    assert twin[twin.index("--mqtt") + 1] == "mqtt://mosquitto:1883"
    without = compose["services"]["twin"]["command"]
    assert [arg for arg in twin if arg not in ("--mqtt", "mqtt://mosquitto:1883")] == without
    config = (REPO / "deploy/mosquitto/mosquitto.conf").read_text().splitlines()
    assert "persistence true" in config
    assert "max_queued_messages 1000000" in config
    for service in services.values():
        for dependency, condition in service.get("depends_on", {}).items():
            assert condition == {"condition": "service_healthy"}, dependency
