"""indexer/language.py: a collection that does not look English is named so, one that does (prose, titles, names) is
not; the guess counts function words and the letters outside the Latin script."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from aheadrank.indexer.collections import Collection, join_title_text
from aheadrank.indexer.language import (
    NAMES,
    LanguageCounts,
    bm25_language,
    check_bm25_language,
    language_warning,
)

SAMPLE = Path(__file__).resolve().parents[2] / "aheadrank" / "data" / "scifact-sample"
PROSE = {
    "fr": "Le chat dort sur le canapé et il ne veut pas se lever. Les enfants sont partis à l'école avec leurs amis "
    "pour la journée. Nous avons mangé une soupe chaude dans la cuisine, puis nous sommes sortis au marché qui se "
    "trouve sur la place du village. Ce matin, le ciel était gris et la pluie tombait sans arrêt.",
    "de": "Der Hund schläft auf dem Sofa und will nicht aufstehen. Die Kinder sind mit ihren Freunden in die Schule "
    "gegangen. Wir haben eine warme Suppe in der Küche gegessen und sind dann auf den Markt gegangen, der sich auf "
    "dem Platz des Dorfes befindet. Heute Morgen war der Himmel grau und es hat nicht aufgehört zu regnen.",
    "es": "El perro duerme en el sofá y no quiere levantarse. Los niños se fueron a la escuela con sus amigos para "
    "todo el día. Comimos una sopa caliente en la cocina y luego salimos al mercado que está en la plaza del pueblo. "
    "Esta mañana el cielo estaba gris y la lluvia caía sin parar, como siempre en esta época del año.",
    "non-latin": "猫在沙发上睡觉，不想起来。孩子们和朋友一起去学校了。我们在厨房里喝了热汤，然后去了村子广场上的市场。",
}


def counted(texts) -> LanguageCounts:
    counts = LanguageCounts()
    for text in texts:
        counts.add(text)
    return counts


def english_sample() -> list[str]:
    return [join_title_text(t, b) for _, t, b in Collection(SAMPLE / "corpus.jsonl").titled()]


@pytest.mark.parametrize("code", sorted(PROSE))
def test_prose_in_another_language_is_named_and_warned_of(code):
    counts = counted([PROSE[code]] * 3)
    assert counts.guess() == code and counts.summary()["guess"] == code
    warning = language_warning(counts, "c.jsonl")
    assert warning.startswith("c.jsonl does not look English") and "not been measured" in warning
    assert ("Latin script" in warning) == (
        code == "non-latin"
    ) and "BM25's analyzer, the bi-encoder" in warning
    # BM25 follows the guess where it is a language we have an analyzer for; another script stays English
    assert bm25_language(counts.guess()) == ("en" if code == "non-latin" else code)
    if code != "non-latin":
        said = language_warning(counts, "c.jsonl", bm25=code)
        assert f"BM25 indexes it with Lucene's {NAMES[code]} analyzer, but the bi-encoder" in said


def test_english_prose_titles_and_names_are_not_warned_of():
    prose = english_sample()
    titles = [t for _, t, _ in Collection(SAMPLE / "corpus.jsonl").titled()]
    names = [
        "Women's red running shoe size 7",
        "USB-C charging cable 2 m",
        "Stainless steel water bottle",
    ] * 20
    for texts in (prose, titles, [" ".join(t.split()[:8]) for t in titles], names):
        counts = counted(texts)
        assert counts.guess() is None and language_warning(counts, "c") is None
        assert counts.summary()["guess"] == "en"
    assert (
        counted(prose).summary()["english_share"] > 0.15
    )  # English prose: about 0.2 (the docstring's numbers)
    # half English, half French: no clear guess, no warning
    assert counted(prose[:20] + [PROSE["fr"]] * 20).guess() is None


def test_the_bm25_languages_are_the_guessed_ones_and_another_is_refused():
    assert bm25_language(None) == bm25_language("non-latin") == "en" and bm25_language("nl") == "nl"
    assert check_bm25_language("fr") == "fr"
    with pytest.raises(ValueError, match="unknown BM25 language 'zh': one of en, fr, de, es, it, pt, nl"):
        check_bm25_language("zh")


def test_a_word_on_two_lists_counts_for_neither():
    from aheadrank.indexer.language import FUNCTION_WORDS

    seen = [w for words in FUNCTION_WORDS.values() for w in words]
    assert len(seen) == len(set(seen)) and "que" not in seen and "des" not in seen


def test_a_build_records_the_collection_language_and_warns_of_another(tmp_path, monkeypatch):
    import aheadrank.build as build_module
    from aheadrank.build import BuildPlan, stage_collection

    path = tmp_path / "fr.jsonl"
    path.write_text("".join(json.dumps({"id": f"d{i}", "contents": PROSE["fr"]}) + "\n" for i in range(30)))
    warned = []
    monkeypatch.setattr(build_module.log, "warning", lambda msg, *a: warned.append(msg % a if a else msg))
    monkeypatch.setattr(build_module, "_speed_probe", lambda plan, texts: None)  # no model to time here
    stage = stage_collection(BuildPlan(collection=str(path), out=str(tmp_path / "o")))
    assert stage["language"]["guess"] == "fr" and stage["language"]["english_share"] == 0
    assert len(warned) == 1 and "does not look English" in warned[0] and "French analyzer" in warned[0]
    # told --language en, the build says its BM25 is English too
    stage_collection(BuildPlan(collection=str(path), out=str(tmp_path / "o2"), language="en"))
    assert len(warned) == 2 and "BM25's analyzer, the bi-encoder" in warned[1]
    english = tmp_path / "en.jsonl"
    english.write_text(
        "".join(json.dumps({"id": f"d{i}", "contents": t}) + "\n" for i, t in enumerate(english_sample()))
    )
    assert (
        stage_collection(BuildPlan(collection=str(english), out=str(tmp_path / "e")))["language"]["guess"]
        == "en"
    )
    assert len(warned) == 2
