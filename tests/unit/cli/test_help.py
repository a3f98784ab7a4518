"""Every command's help stands alone: it says what the command does without internal documents,
and every option and argument is explained."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import typer
from typer import _click as click
from typer.core import TyperCommand, TyperGroup
from typer.testing import CliRunner

from app.cli import COMMANDS, cli

JARGON = ("SPEC", "lab's", "the lab")


def walk(group: TyperGroup, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """The path of every command and group under `group`, `group` itself first."""
    yield path
    context = click.Context(group)
    for name in group.list_commands(context):
        command = group.get_command(context, name)
        if isinstance(command, TyperGroup):
            yield from walk(command, (*path, name))
        else:
            yield (*path, name)


ROOT = typer.main.get_command(cli)
assert isinstance(ROOT, TyperGroup)
PATHS = list(walk(ROOT))


def command_at(path: tuple[str, ...]) -> TyperCommand | TyperGroup:
    command: TyperCommand | TyperGroup = ROOT
    for name in path:
        assert isinstance(command, TyperGroup)
        found = command.get_command(click.Context(command), name)
        assert isinstance(found, TyperCommand | TyperGroup)
        command = found
    return command


def test_the_list_of_commands_says_what_each_command_says_of_itself() -> None:
    """`twinwatch --help` lists the commands without importing them (`COMMANDS`): each line is
    where its command's own help begins."""
    for name, (_, line) in COMMANDS.items():
        real = " ".join((command_at((name,)).help or "").split())
        assert real.startswith(" ".join(line.split())), (name, real)


def test_every_command_is_reachable() -> None:
    assert {" ".join(path) for path in PATHS} >= {
        "simulate",
        "train",
        "calibrate",
        "evaluate forecast",
        "evaluate monitor",
        "serve",
        "twin",
        "demo",
        "db upgrade",
        "db downgrade",
        "db current",
    }


@pytest.mark.parametrize("path", PATHS, ids=lambda path: " ".join(path) or "twinwatch")
def test_help_names_no_internal_document(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(cli, [*path, "--help"], env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    command = command_at(path)
    texts = [command.help or "", *(getattr(param, "help", None) or "" for param in command.params)]
    for word in JARGON:
        assert all(word not in text for text in [result.output, *texts]), word
    assert "<bool>" not in result.output  # a flag takes no value: no type beside it


@pytest.mark.parametrize("path", PATHS, ids=lambda path: " ".join(path) or "twinwatch")
def test_every_option_and_argument_has_help(path: tuple[str, ...]) -> None:
    command = command_at(path)
    assert command.help, "the command itself"
    for param in command.params:
        assert getattr(param, "help", None), f"{param.name} has no help"


def test_serve_help_names_every_setting_with_its_meaning() -> None:
    from app.settings import Settings

    result = CliRunner().invoke(cli, ["serve", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for name, field in Settings.model_fields.items():
        assert f"TWINWATCH_{name.upper()}" in result.output, name
        assert field.description, f"{name} has no description"
