"""Checkpoints: save/load bit for bit; missing, partial, corrupt and mismatched checkpoints are clear errors."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from aheadrank.rankers import compute_fingerprint, init_ranker, load_ranker, read_fingerprint, save_checkpoint
from aheadrank.rankers.checkpoint import REQUIRED
from typer.testing import CliRunner

from aheadrank.errors import CheckpointError

QUERY = "insulin resistance in obesity"
DOCS = ["insulin glucose liver obesity", "the heart and blood pressure", "a vaccine immune response study"]


@pytest.mark.parametrize(
    ("kind", "opts"),
    [
        ("bert", {}),
        ("mores", {"ibs": 2, "tied": True}),
        ("prettr", {"layer": 2, "compress": 8}),
        ("tk", {"tk_heads": 4}),
    ],
)
def test_round_trip_bit_for_bit(tiny_base, tmp_path, kind, opts):
    ranker = init_ranker(kind, base=tiny_base, max_doc_len=32, **opts)
    fp = save_checkpoint(ranker, tmp_path / "ckpt")
    assert fp == read_fingerprint(tmp_path / "ckpt") == compute_fingerprint(tmp_path / "ckpt")
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert config["kind"] == kind and config["max_doc_len"] == 32 and config["bert"]["num_hidden_layers"] == 4
    loaded = load_ranker(tmp_path / "ckpt")
    assert loaded.fingerprint == fp
    with torch.no_grad():
        assert torch.equal(loaded.score_pairs(QUERY, DOCS), ranker.score_pairs(QUERY, DOCS))
    assert torch.equal(
        loaded.score(loaded.encode_query(QUERY), loaded.encode_documents(DOCS)),
        ranker.score(ranker.encode_query(QUERY), ranker.encode_documents(DOCS)),
    )


def test_mores_strategy_chosen_at_load(tiny_base, tmp_path):
    save_checkpoint(init_ranker("mores", base=tiny_base, ibs=2), tmp_path / "m")
    assert set(load_ranker(tmp_path / "m").field_dims()) == {"k1", "v1", "k2", "v2"}  # default s2
    assert set(load_ranker(tmp_path / "m", strategy="s1").field_dims()) == {"doc"}
    with pytest.raises(ValueError, match="strategies"):
        load_ranker(tmp_path / "m", strategy="s3")


def test_missing_partial_corrupt_and_mismatched(tiny_base, tmp_path):
    ck = tmp_path / "ck"
    save_checkpoint(init_ranker("mores", base=tiny_base, ibs=1), ck)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_ranker(tmp_path / "nowhere")
    with pytest.raises(CheckpointError, match="already exists"):
        save_checkpoint(init_ranker("bert", base=tiny_base), ck)
    for name in REQUIRED:  # partial
        broken = tmp_path / f"no-{name}"
        shutil.copytree(ck, broken)
        (broken / name).unlink()
        with pytest.raises(CheckpointError, match=f"missing {name}"):
            load_ranker(broken)
    corrupt = tmp_path / "corrupt"  # one flipped byte in the weights
    shutil.copytree(ck, corrupt)
    data = bytearray((corrupt / "model.safetensors").read_bytes())
    data[-10] ^= 0xFF
    (corrupt / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupt or was modified"):
        load_ranker(corrupt)
    # weights of one kind under the config of another, with a freshly recomputed fingerprint
    mixed = tmp_path / "mixed"
    shutil.copytree(ck, mixed)
    save_checkpoint(init_ranker("bert", base=tiny_base), tmp_path / "b")
    shutil.copyfile(tmp_path / "b" / "model.safetensors", mixed / "model.safetensors")
    (mixed / "fingerprint.json").write_text(json.dumps({"sha256": compute_fingerprint(mixed)}))
    with pytest.raises(CheckpointError, match="do not match"):
        load_ranker(mixed)
    bad_cfg = tmp_path / "badcfg"
    shutil.copytree(ck, bad_cfg)
    cfg = json.loads((bad_cfg / "config.json").read_text())
    cfg["ibs"] = 9
    (bad_cfg / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="ibs"):
        load_ranker(bad_cfg)
    # named with their checkpoint: the config alone cannot say which
    for text, why in (('{"kind": "foo"}', "config.json lacks 'bert'"), ("[1]", "is not a ranker config")):
        (bad_cfg / "config.json").write_text(text)
        with pytest.raises(CheckpointError, match=f"^checkpoint {bad_cfg}: .*{why}"):
            load_ranker(bad_cfg)


def test_invalid_options_are_clear_errors(tiny_base):
    with pytest.raises(CheckpointError, match="unknown ranker kind"):
        init_ranker("colbert", base=tiny_base)
    with pytest.raises(CheckpointError, match="layer"):
        init_ranker("prettr", base=tiny_base, layer=4)  # L = 4: l must be <= 3
    with pytest.raises(CheckpointError, match="positions"):
        init_ranker("bert", base=tiny_base, max_doc_len=250)  # 16 + 250 + 3 > 256 positions
    with pytest.raises(CheckpointError, match="no config.json"):
        init_ranker("bert", base=tiny_base.parent)


def test_init_ranker_cli(tiny_base, tmp_path):
    from aheadrank.cli import app

    runner = CliRunner()
    out = tmp_path / "cli-ckpt"
    res = runner.invoke(
        app,
        [
            "init-ranker",
            "mores",
            "--out",
            str(out),
            "--base",
            str(tiny_base),
            "--ibs",
            "3",
            "--pooling",
            "mean",
            "--tied",
            "--sim",
            "--max-doc-len",
            "40",
        ],
    )
    assert res.exit_code == 0, res.output
    r = load_ranker(out)
    assert (r.config.ibs, r.config.pooling, r.config.tied, r.config.max_doc_len) == (3, "mean", True, 40)
    assert r.config.sim and not r.head.weight.any()  # the similarity residual, its head starting at zero
    res = runner.invoke(
        app,
        ["init-ranker", "tk", "--out", str(tmp_path / "t"), "--base", str(tiny_base), "--layers", "1"],
        env={"AHEADRANK_RANKER_MAX_QUERY_LEN": "8"},
    )
    assert res.exit_code == 0, res.output
    tk = load_ranker(tmp_path / "t")
    assert (tk.config.tk_layers, tk.config.max_query_len) == (1, 8)  # the option came from its env variable
    res = runner.invoke(
        app, ["init-ranker", "bert", "--out", str(tmp_path / "x"), "--base", str(tiny_base), "--ibs", "2"]
    )
    assert res.exit_code == 2 and "--ibs does not apply" in res.output
    res = runner.invoke(
        app, ["init-ranker", "tk", "--out", str(tmp_path / "y"), "--base", str(tiny_base), "--sim"]
    )
    assert res.exit_code == 2 and "--sim does not apply" in res.output
    res = runner.invoke(app, ["init-ranker", "mores", "--out", str(out), "--base", str(tiny_base)])
    assert res.exit_code == 2 and "already exists" in res.output and "--overwrite" in res.output


def test_overwrite_replaces_a_checkpoint_and_nothing_else(tiny_base, tmp_path, monkeypatch):
    """--overwrite replaces a checkpoint folder (or an empty one); a folder of other files or a file is refused in
    one line, untouched; a folder it cannot write in is one line too."""
    from aheadrank.cli import app

    runner = CliRunner()

    def init(out, *flags):
        return runner.invoke(app, ["init-ranker", "tk", "--layers", "1", "--base", str(tiny_base),
                                   "--out", str(out), *flags])  # fmt: skip

    ckpt = tmp_path / "ckpt"
    assert init(ckpt).exit_code == 0
    assert init(ckpt, "--overwrite", "--seed", "1").exit_code == 0  # a checkpoint: replaced
    (tmp_path / "empty").mkdir()
    assert init(tmp_path / "empty", "--overwrite").exit_code == 0
    notes = tmp_path / "mine"
    notes.mkdir()
    (notes / "notes.txt").write_text("precious")
    res = init(notes, "--overwrite")
    assert res.exit_code == 2 and "--overwrite refused" in res.output and "notes.txt" in res.output, (
        res.output
    )
    assert [p.name for p in notes.iterdir()] == ["notes.txt"]
    file = tmp_path / "file"
    file.write_text("precious")
    res = init(file, "--overwrite")
    assert res.exit_code == 2 and "is a file, not a checkpoint directory" in res.output, res.output
    assert file.read_text() == "precious"

    def denied(*a, **k):
        raise PermissionError(13, "Permission denied", str(tmp_path))

    monkeypatch.setattr("tempfile.mkdtemp", denied)  # what a read-only parent gives (root ignores chmod)
    res = init(tmp_path / "new")
    errors = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.exit_code == 2 and len(errors) == 1, res.output
    assert errors[0].startswith("error: cannot write the checkpoint") and "permission denied" in errors[0]


def test_describe_says_whether_the_similarity_residual_is_on(tiny_base):
    """describe() (the service's /v1/info, the store manifest's ranker) records ``sim`` where the config sets it."""
    on = init_ranker("prettr", base=tiny_base, layer=1, compress=0, sim=True)
    off = init_ranker("mores", base=tiny_base, ibs=1, sim=False)
    assert on.describe()["sim"] is True and off.describe()["sim"] is False
    assert "sim" not in init_ranker("tk", base=tiny_base).describe()  # no residual for TK (None)


# ---- issue 37, item 5: the tokenizer files are fingerprinted -----------------------------------------
def _swap_tokens(ck, file: str) -> None:
    """Give two ordinary word pieces each other's id in ``file`` (the same weights then read other rows)."""
    if file == "tokenizer.json":
        data = json.loads((ck / file).read_text())
        vocab = data["model"]["vocab"]
        vocab["protein"], vocab["tumor"] = vocab["tumor"], vocab["protein"]
        (ck / file).write_text(json.dumps(data))
    elif file == "vocab.txt":
        lines = (ck / file).read_text().split("\n")
        a, b = lines.index("insulin"), lines.index("obesity")
        lines[a], lines[b] = lines[b], lines[a]
        (ck / file).write_text("\n".join(lines))
    elif file == "special_tokens_map.json":
        data = json.loads((ck / file).read_text())
        data["unk_token"] = "[MASK]"
        (ck / file).write_text(json.dumps(data))
    else:  # a tokenizer file added beside the recorded ones
        (ck / file).write_text(json.dumps({"glucose-insulin": 30522}))


@pytest.fixture(scope="module")
def tokenizer_ckpt(tiny_base, tmp_path_factory):
    ck = tmp_path_factory.mktemp("tok") / "ck"
    fp = save_checkpoint(init_ranker("mores", base=tiny_base, ibs=1), ck)
    return ck, fp


@pytest.mark.parametrize(
    "file", ["tokenizer.json", "vocab.txt", "special_tokens_map.json", "added_tokens.json"]
)
def test_a_changed_tokenizer_file_is_refused(tokenizer_ckpt, tmp_path, file):
    ck, fp = tokenizer_ckpt
    record = json.loads((ck / "fingerprint.json").read_text())
    assert record["sha256"] == fp == compute_fingerprint(ck)  # the model fingerprint: config + weights only
    assert "tokenizer.json" in record["tokenizer_files"] and "vocab.txt" in record["tokenizer_files"]
    changed = shutil.copytree(ck, tmp_path / "changed")
    _swap_tokens(changed, file)
    with pytest.raises(CheckpointError, match="tokenizer files"):
        load_ranker(changed)


def test_an_old_checkpoint_loads_with_a_warning_until_its_tokenizer_is_recorded(
    tokenizer_ckpt, tmp_path, caplog
):
    from aheadrank.cli import app

    ck, fp = tokenizer_ckpt
    old = shutil.copytree(ck, tmp_path / "old")
    record = json.loads((old / "fingerprint.json").read_text())
    for key in ("tokenizer_sha256", "tokenizer_files"):
        record.pop(key)
    (old / "fingerprint.json").write_text(json.dumps(record))  # as written before the tokenizer was recorded
    with caplog.at_level("WARNING", logger="aheadrank.rankers"):
        loaded = load_ranker(old)
    assert loaded.fingerprint == fp and "fingerprint-tokenizer" in loaded.fingerprint_notice
    assert any("fingerprint-tokenizer" in r.getMessage() for r in caplog.records)
    out = CliRunner().invoke(app, ["fingerprint-tokenizer", str(old)])
    assert out.exit_code == 0, out.output
    assert read_fingerprint(old) == fp  # stores built by it still match
    assert load_ranker(old).fingerprint_notice is None
    _swap_tokens(old, "vocab.txt")
    with pytest.raises(CheckpointError, match="tokenizer files"):
        load_ranker(old)
    out = CliRunner().invoke(app, ["fingerprint-tokenizer", str(old)])  # not silently re-recorded
    assert out.exit_code != 0 and "--replace" in out.output, out.output
    for name in ("tokenizer.json", "vocab.txt"):  # nor a tokenizer without its vocabulary
        (old / name).unlink()
    out = CliRunner().invoke(app, ["fingerprint-tokenizer", str(old), "--replace"])
    assert out.exit_code == 2 and "no tokenizer.json or vocab.txt" in out.output, out.output


@pytest.mark.parametrize("damage", ['{"sha256": "ab', "[1, 2]", '{"tokenizer_sha256": "x"}'])
def test_a_damaged_fingerprint_record_is_one_line_everywhere_it_is_read(tokenizer_ckpt, tmp_path, damage):
    """fingerprint.json cut short, not an object, or without its sha256: a CheckpointError naming the checkpoint
    from loading, the tokenizer record and the priors' write (a JSONDecodeError / AttributeError before)."""
    from aheadrank.rankers.checkpoint import record_tokenizer, write_priors

    from aheadrank.cli import app

    ck, _ = tokenizer_ckpt
    bad = shutil.copytree(ck, tmp_path / "bad")
    (bad / "fingerprint.json").write_text(damage)
    for call in (load_ranker, record_tokenizer, lambda p: write_priors(p, {"weights": {}})):
        with pytest.raises(CheckpointError, match=r"checkpoint .*bad: fingerprint.json"):
            call(bad)
    out = CliRunner().invoke(app, ["fingerprint-tokenizer", str(bad)])
    assert out.exit_code == 2 and "fingerprint.json" in out.output and "Traceback" not in out.output
    assert (bad / "fingerprint.json").read_text() == damage and not (bad / "priors.json").exists()


# ---- issue 37, item 9: priors.json and fingerprint.json change together ---------------------------------
_KILL_CHILD = """
import os, signal, sys
from aheadrank.rankers import checkpoint
real, calls = os.replace, [0]
def replace(src, dst):
    calls[0] += 1
    if calls[0] == {n} and {before}:
        os.kill(os.getpid(), signal.SIGKILL)
    real(src, dst)
    if calls[0] == {n} and not {before}:
        os.kill(os.getpid(), signal.SIGKILL)
checkpoint.os.replace = replace
checkpoint.write_priors(sys.argv[1], {{"weights": {{"neural": {{"neural": 1.0}}}}, "fitted_on": {{"run": "new"}}}})
"""


@pytest.mark.parametrize("before", [True, False])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_a_kill_while_priors_are_written_leaves_a_checkpoint_that_loads(tokenizer_ckpt, tmp_path, n, before):
    import subprocess
    import sys

    from aheadrank.rankers.checkpoint import write_priors

    ck = shutil.copytree(tokenizer_ckpt[0], tmp_path / "ck")
    old = {"weights": {"neural": {"neural": 1.0}}, "fitted_on": {"run": "old"}}
    write_priors(ck, old)
    code = _KILL_CHILD.format(n=n, before=before)
    out = subprocess.run([sys.executable, "-c", code, str(ck)], capture_output=True, text=True, timeout=120)
    killed = out.returncode == -9
    assert killed or out.returncode == 0, out.stderr  # past the last rename: it finished
    loaded = load_ranker(ck)  # never "priors.json is corrupt": one consistent pair, old or new
    assert loaded.priors["fitted_on"]["run"] in ("old", "new")
    if not killed:
        assert loaded.priors["fitted_on"]["run"] == "new"
    write_priors(ck, {**old, "fitted_on": {"run": "again"}})  # a rerun finishes the write
    assert load_ranker(ck).priors["fitted_on"]["run"] == "again"
    assert json.loads((ck / "fingerprint.json").read_text()).keys() >= {"sha256", "priors_sha256"}
