"""Every option of every ``aheadrank`` command is mirrored by an ``AHEADRANK_*`` environment variable (the CLI
package's promise, :func:`aheadrank.cli.options.opt`), the variable sets the option, and no variable means two
things to two commands (a shell that exports one for ``serve`` must not change what ``train`` does)."""

from __future__ import annotations

import typer.main
from typer.testing import CliRunner

from aheadrank.cli import app

# variables several commands read with types that differ in spelling only: build's --ranker takes a variant name,
# train's a kind (a variant name too)
SAME_MEANING = {"AHEADRANK_RANKER"}


def options() -> list[tuple[str, object]]:
    """(command, option) for every option of every command (typer's own click: not ``click.Option`` instances)."""
    command = typer.main.get_command(app)
    return [
        (name, p)
        for name, sub in command.commands.items()
        for p in sub.params
        if p.param_type_name == "option"
    ]


def variables(param) -> list[str]:
    return list(param.envvar) if isinstance(param.envvar, (list, tuple)) else [param.envvar]


def options_without_variable() -> list[str]:
    return [
        f"{name} {'/'.join(p.opts)}"
        for name, p in options()
        if not all(n and n.startswith("AHEADRANK_") for n in variables(p))
    ]


def test_every_option_has_its_environment_variable():
    assert len(options()) > 100  # the check sees the options (typer's params are not click.Option instances)
    assert options_without_variable() == []


def test_no_variable_means_two_things():
    """A variable read by several commands is a switch everywhere or nowhere and of one type: AHEADRANK_WARMUP was
    serve's switch and train's warm-up fraction, AHEADRANK_PRIORS build's mode and serve's switch,
    AHEADRANK_TEACHER a name and a checkpoint path, AHEADRANK_JSON a path and a switch, AHEADRANK_STEPS train's
    and the compressor's steps, AHEADRANK_MAX_QUERY_LEN a new ranker's length and how much serve reads, and
    AHEADRANK_BATCH_SIZE serve's candidates and index's documents per pass."""
    seen: dict[str, set] = {}
    for _, p in options():
        kind = str(p.bare_type())
        kind = "str" if kind.startswith("typing.Literal") else kind  # a choice of words is a word
        for var in variables(p):
            seen.setdefault(var, set()).add((p.is_flag, kind))
    mixed = {
        v: sorted(map(str, kinds)) for v, kinds in seen.items() if len(kinds) > 1 and v not in SAME_MEANING
    }
    assert mixed == {}
    # the renames that keep it so (the default names meant something else to another command)
    by_option = {(name, p.name): variables(p) for name, p in options()}
    assert by_option[("train", "warmup")] == ["AHEADRANK_LR_WARMUP"]
    assert by_option[("train", "max_query_len")] == ["AHEADRANK_RANKER_MAX_QUERY_LEN"]
    assert by_option[("index", "batch_size")] == ["AHEADRANK_DOC_BATCH_SIZE"]
    assert by_option[("pretrain-compressor", "steps")] == ["AHEADRANK_COMPRESSOR_STEPS"]


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
