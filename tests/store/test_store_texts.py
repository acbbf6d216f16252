"""Text digests (store/texts.py): written per shard, looked up by the reader, checked by verify_store."""

from __future__ import annotations

import json
import unicodedata

import h5py
import numpy as np
import pytest
from aheadrank.store import StoreReader, StoreWriter, read_manifest, verify_store
from aheadrank.store.texts import TEXT_DIGEST, normalise_text, text_digest
from store_testkit import build, make_docs, make_spec

from aheadrank.errors import StoreError

TEXTS = [f"Document number {i}: caf\u00e9 and\tsome  words {i * 7}." for i in range(10)]


def build_with_texts(path, texts=TEXTS, shard_size=4):
    docs = make_docs(len(texts))
    with StoreWriter(path, make_spec(shard_size=shard_size)) as writer:
        for (docid, fields), text in zip(docs.items(), texts, strict=True):
            writer.add(docid, fields, text=text)
    return list(docs)


def test_normalisation_keeps_what_the_tokenizer_reads():
    assert normalise_text("  a\u00a0 b\t\nc \u3000") == "a b c"
    assert text_digest("cafe\u0301 au lait") == text_digest("caf\u00e9  au\nlait ")
    assert text_digest("a b") != text_digest("ab") and text_digest("a.") != text_digest("a")
    assert len(text_digest("")) == 32


def test_texts_are_found_in_the_store_by_their_digest(tmp_path):
    ids = build_with_texts(tmp_path / "s")
    manifest = read_manifest(tmp_path / "s")
    assert manifest.text_digest == TEXT_DIGEST and all(s.text_digest == TEXT_DIGEST for s in manifest.shards)
    assert json.loads((tmp_path / "s" / "manifest.json").read_text())["text_digest"] == TEXT_DIGEST
    with StoreReader(tmp_path / "s") as reader:
        assert reader.text_shards == len(manifest.shards) == 3
        variants = [unicodedata.normalize("NFD", t).replace(" ", "\n ") for t in TEXTS]
        asked = [text_digest(t) for t in [*variants, "not in the store", TEXTS[3] + " more"]]
        found = reader.find_texts(asked)
        lengths = dict(zip(ids, reader.fetch(ids).lengths.tolist(), strict=True))
        assert found[:10] == [(d, lengths[d]) for d in ids]
        assert found[10:] == [None, None]
        assert reader.find_texts([]) == []
    assert verify_store(tmp_path / "s", texts=zip(ids, TEXTS, strict=True)) == []


def test_a_refused_shard_is_not_looked_up(tmp_path):
    ids = build_with_texts(tmp_path / "s")
    with StoreReader(tmp_path / "s") as reader:
        reader.mark_damaged([ids[0]], "test")
        found = reader.find_texts([text_digest(TEXTS[0]), text_digest(TEXTS[5])])
        assert found[0] is None and found[1] is not None and found[1][0] == ids[5]


def test_equal_texts_resolve_to_one_stored_document(tmp_path):
    ids = build_with_texts(tmp_path / "s", ["same text", "other", "same  text"], shard_size=2)
    with StoreReader(tmp_path / "s") as reader:
        assert reader.find_texts([text_digest("same text")])[0][0] in (ids[0], ids[2])


def test_a_store_without_digests_still_opens_and_finds_nothing(tmp_path):
    docs = make_docs(6)
    build(tmp_path / "old", make_spec(), docs)
    manifest = read_manifest(tmp_path / "old")
    assert (
        manifest.text_digest == "" and "text_digest" not in (tmp_path / "old" / "manifest.json").read_text()
    )
    with StoreReader(tmp_path / "old") as reader:
        assert reader.text_shards == 0
        assert reader.find_texts([text_digest("anything")]) == [None]
        assert len(reader.fetch(list(docs))) == 6
    assert verify_store(tmp_path / "old") == []
    # the collection check still compares docids where there are no digests
    assert verify_store(tmp_path / "old", texts=[(d, "x") for d in docs]) == []


def test_a_shard_has_digests_for_all_its_documents_or_none(tmp_path):
    docs = make_docs(2)
    (a, fa), (b, fb) = docs.items()
    with StoreWriter(tmp_path / "s", make_spec()) as writer:
        writer.add(a, fa, text="one")
        with pytest.raises(StoreError, match="every document or for none"):
            writer.add(b, fb)


def rewrite_digest(path, shard_file, row, digest):
    """Overwrite one stored digest in place and record the file's new sha256 (what a buggy writer would leave:
    every file check passes, only the texts can tell)."""
    from aheadrank.fsfaults import sha256_file

    file = path / shard_file
    with h5py.File(file, "r+") as h5:
        h5["text_sha256"][row] = np.frombuffer(digest, dtype=np.uint8)
    data = json.loads((path / "manifest.json").read_text())
    for shard in data["shards"]:
        if shard["file"] == shard_file:
            shard["sha256"], shard["bytes"] = sha256_file(file), file.stat().st_size
    (path / "manifest.json").write_text(json.dumps(data))


def test_verify_store_catches_a_wrong_digest(tmp_path):
    path = tmp_path / "s"
    ids = build_with_texts(path)
    shard = read_manifest(path).shards[1]
    rewrite_digest(path, shard.file, 2, text_digest(TEXTS[0]))  # document 6 claims document 0's text
    assert verify_store(path) == []  # the files are consistent with the manifest ...
    problems = verify_store(path, texts=zip(ids, TEXTS, strict=True))  # ... but not with the texts
    assert len(problems) == 1 and shard.file in problems[0] and repr(ids[6]) in problems[0], problems
    # a changed collection is named too
    other = [*TEXTS[:9], "a changed last document"]
    problems = verify_store(path, texts=zip(ids, other, strict=True))
    assert any(repr(ids[9]) in p for p in problems), problems


def test_verify_store_catches_digests_the_manifest_does_not_list(tmp_path):
    path = tmp_path / "s"
    build_with_texts(path)
    data = json.loads((path / "manifest.json").read_text())
    del data["shards"][0]["text_digest"]
    (path / "manifest.json").write_text(json.dumps(data))
    problems = verify_store(path)
    assert len(problems) == 1 and "shard-00000.h5" in problems[0] and "text digests" in problems[0]


def test_verify_store_cli_takes_the_collection(tmp_path):
    from typer.testing import CliRunner

    from aheadrank.cli import app

    path = tmp_path / "s"
    ids = build_with_texts(path)
    collection = tmp_path / "corpus.tsv"
    collection.write_text(
        "".join(f"{d}\t{t.replace(chr(9), ' ')}\n" for d, t in zip(ids, TEXTS, strict=True))
    )
    result = CliRunner().invoke(app, ["verify-store", str(path), "--collection", str(collection)])
    assert result.exit_code == 0, result.output
    rewrite_digest(path, "shard-00000.h5", 1, text_digest("something else"))
    result = CliRunner().invoke(app, ["verify-store", str(path), "--collection", str(collection)])
    assert result.exit_code == 1 and repr(ids[1]) in result.output, result.output
