"""Which ranker variant ``aheadrank build`` makes: a kind may mean another variant than the kind's default, one
for a label-free build (``aheadrank.build.LABEL_FREE_VARIANTS``), one for a build with judgments
(``JUDGED_VARIANTS``); named as a variant, it is that variant."""

from __future__ import annotations

import json

import pytest

from aheadrank.build import BuildPlan, plan_variant
from aheadrank.errors import AheadrankError


def collection(tmp_path, judged: bool):
    path = tmp_path / ("judged" if judged else "plain")
    path.mkdir()
    (path / "corpus.jsonl").write_text(json.dumps({"_id": "d", "text": "a b c"}) + "\n")
    if judged:
        (path / "qrels").mkdir()
        (path / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\nq\td\t1\n")
    return path


def test_label_free_tk_is_contextualised_by_every_layer_of_the_base(tmp_path, tiny_base):
    plain, judged = collection(tmp_path, False), collection(tmp_path, True)
    layers = json.loads((tiny_base / "config.json").read_text())["num_hidden_layers"]

    def made(path, ranker, **kw):
        return plan_variant(BuildPlan(str(path), "o", ranker=ranker, base=str(tiny_base), **kw))

    tk = made(plain, "tk")
    assert (tk.name, tk.kind) == (f"tk-{layers}l-base", "tk")
    assert tk.options == {"tk_layers": layers, "tk_base": True}
    assert made(judged, "tk", labels="none").name == f"tk-{layers}l-base"
    # with judgments the kind is TK from the base reading each text between [CLS] and [SEP]; a named variant is
    # what it says
    judged_tk = made(judged, "tk")
    assert judged_tk.name == f"tk-{layers}l-base-specials"
    assert judged_tk.options == {"tk_layers": layers, "tk_base": True, "tk_specials": True}
    assert made(judged, "tk-2l").name == "tk-2l"
    assert made(plain, "tk-2l").name == "tk-2l"
    assert made(plain, "tk-1l-base").name == "tk-1l-base"
    specials = made(plain, "tk-1l-base-specials")
    assert specials.options == {"tk_layers": 1, "tk_base": True, "tk_specials": True}
    # the other kinds keep their defaults either way
    assert made(plain, "mores").name == made(judged, "mores").name == "mores-2ib-s2"
    # an unknown ranker and a missing labels split fail with one error, as before
    with pytest.raises(AheadrankError, match="qrels/dev.tsv"):
        made(plain, "tk", labels="dev")
    with pytest.raises(Exception, match="nope"):
        made(plain, "nope")


def test_the_packaged_base_gives_tk_6l_base(tmp_path):
    """The README's and docs' names for TK: the packaged all-MiniLM-L6-v2 has 6 layers."""
    assert plan_variant(BuildPlan(str(collection(tmp_path, False)), "o", ranker="tk")).name == "tk-6l-base"
    judged = plan_variant(BuildPlan(str(collection(tmp_path, True)), "o", ranker="tk"))
    assert judged.name == "tk-6l-base-specials"
