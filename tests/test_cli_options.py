"""Every option of every ``aheadrank`` command is mirrored by an ``AHEADRANK_*`` environment variable (the CLI
package's promise, :func:`aheadrank.cli.options.opt`), and the variable sets the option."""

from __future__ import annotations

import click
import typer.main
from typer.testing import CliRunner

from aheadrank.cli import app


def options_without_variable() -> list[str]:
    command = typer.main.get_command(app)
    missing = []
    for name, sub in command.commands.items():
        for param in sub.params:
            if not isinstance(param, click.Option):
                continue
            names = param.envvar if isinstance(param.envvar, list) else [param.envvar]
            if not all(n and n.startswith("AHEADRANK_") for n in names):
                missing.append(f"{name} {'/'.join(param.opts)}")
    return missing


def test_every_option_has_its_environment_variable():
    assert options_without_variable() == []


def test_a_variable_sets_its_option(service_env):
    """``store-info --json`` through ``AHEADRANK_JSON`` (one of the options that had none): the JSON summary."""
    import json

    runner = CliRunner()
    store = str(service_env.store)
    plain = runner.invoke(app, ["store-info", store])
    by_flag = runner.invoke(app, ["store-info", store, "--json"])
    by_env = runner.invoke(app, ["store-info", store], env={"AHEADRANK_JSON": "1"})
    assert plain.exit_code == by_flag.exit_code == by_env.exit_code == 0, by_env.output
    assert by_env.stdout == by_flag.stdout != plain.stdout
    assert json.loads(by_env.stdout)["documents"] > 0
