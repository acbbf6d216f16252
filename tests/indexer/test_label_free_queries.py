"""Label-free pseudo-queries: titles, sentences or spans cut out of the copy of the document they are matched
against; the copy replaces its source among the query's BM25 candidates; the teacher scores it as its source."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from aheadrank.indexer.collections import Collection
from aheadrank.indexer.pseudo_queries import ALIAS_PREFIX, label_free_queries, sentence_passages

from aheadrank.errors import AheadrankError
from aheadrank.runs import build_label_free_training_data

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau".split()


def corpus(path, n: int, *, titles: bool, punctuation: bool, seed: int = 0):
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        sentences = [" ".join(rng.choices(WORDS, k=rng.randint(7, 14))) for _ in range(4)]
        body = ". ".join(sentences) + "." if punctuation else " ".join(sentences)
        title = " ".join(rng.choices(WORDS, k=5)) if titles else ""
        lines.append(json.dumps({"_id": f"d{i}", "title": title, "text": body}))
    path.write_text("\n".join(lines) + "\n")
    return path


def fake_features(store, queries, cands, qrels=None, device="cpu", base=None):
    """``baselines.dense_features`` without a dense store: BM25 as listed, a dense cosine rising down the list."""
    from aheadrank.priors import QueryFeatures

    return {
        q: QueryFeatures(
            [d for d, _ in cands[q]],
            {"bm25": np.array([s for _, s in cands[q]]), "dense": np.arange(len(cands[q]), dtype=float)},
            {},
        )
        for q in queries
    }


@pytest.mark.parametrize(
    ("titles", "punctuation", "kinds"),
    [(True, True, {"title", "sentence"}), (False, True, {"sentence"}), (False, False, {"span"})],
)
def test_queries_are_cut_out_of_their_documents_copy(tmp_path, titles, punctuation, kinds):
    path = corpus(tmp_path / "corpus.jsonl", 60, titles=titles, punctuation=punctuation)
    pq = label_free_queries(path, max_queries=40, seed=3, cut=1.0)
    assert 20 <= len(pq.queries) <= 40 and set(pq.counts()) == kinds
    for qid, query in pq.queries.items():
        (alias,) = pq.qrels[qid]
        source = pq.aliases[alias]
        assert alias == ALIAS_PREFIX + qid and qid == f"{pq.kinds[qid]}:{source}"
        assert query not in pq.texts[alias]  # inverse cloze: the query is not inside what it is matched to
        assert query in pq.texts[source]  # the indexed document keeps its full text
        assert len(pq.texts[alias].split()) >= 10
    # the same seed, the same queries; another seed, others
    assert label_free_queries(path, max_queries=40, seed=3, cut=1.0).queries == pq.queries
    assert label_free_queries(path, max_queries=40, seed=4, cut=1.0).queries != pq.queries
    # not cut (the default): the copy is the document as indexed
    whole = label_free_queries(path, max_queries=40, seed=3, cut=0.0)
    assert all(whole.texts[a] == whole.texts[s] for a, s in whole.aliases.items())


def test_duplicate_queries_are_made_once(tmp_path):
    # every document: the same boilerplate sentence, then a sentence of its own
    rng = random.Random(1)
    boiler = "this study was funded by the national agency for research."
    lines = [
        json.dumps({"_id": f"d{i}", "title": "", "text": f"{boiler} {' '.join(rng.choices(WORDS, k=12))}."})
        for i in range(40)
    ]
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(lines) + "\n")
    pq = label_free_queries(path, max_queries=40)
    texts = [" ".join(q.lower().split()).rstrip(".") for q in pq.queries.values()]
    assert len(set(texts)) == len(texts) and len(texts) >= 15
    assert sum(t == boiler.rstrip(".") for t in texts) <= 1  # the boilerplate is one query at most


def test_training_data_swaps_the_source_for_its_copy_and_the_teacher_follows(tmp_path, monkeypatch):
    path = corpus(tmp_path / "corpus.jsonl", 40, titles=True, punctuation=True)

    def search(queries, depth):  # every document, the source first when it is one of the first three
        rng = random.Random(len(queries))
        out = {}
        for qid in queries:
            source = qid.split(":", 1)[1]
            others = [f"d{i}" for i in range(40) if f"d{i}" != source]
            rng.shuffle(others)
            ranked = [source, *others] if rng.random() < 0.75 else others
            out[qid] = [(d, float(depth - r)) for r, d in enumerate(ranked[:depth])]
        return out

    data, hits, pq = build_label_free_training_data(path, None, max_queries=30, depth=10, search=search)
    assert set(data.trainable()) == set(data.queries)
    # the copies are the pseudo-queries' own documents: where the collection's documents are drawn (PreTTR's
    # start) they are not drawn twice
    assert set(data.documents()) == {f"d{i}" for i in range(40)} and set(data.copies) == set(pq.aliases)
    for qid in data.queries:
        (alias,) = data.qrels[qid]
        source = pq.aliases[alias]
        listed = [d for d, _ in hits[qid]]
        assert source not in data.candidates[qid]
        assert (alias in data.candidates[qid]) == (source in listed)
        if source in listed:
            assert data.candidates[qid].index(alias) == listed.index(source)

    from aheadrank import baselines

    monkeypatch.setattr(baselines, "dense_features", fake_features)
    teacher = baselines.label_free_teacher("unused", data.queries, hits, pq.aliases, data.qrels)
    for qid in data.queries:
        (alias,) = data.qrels[qid]
        assert set(teacher[qid]) == set(data.candidates[qid])  # the copy scored in its source's place
        if alias in teacher[qid]:
            z = baselines.feature_run({qid: fake_features(0, [qid], hits)[qid]}, baselines.EQUAL_FUSION)[qid]
            assert teacher[qid][alias] == z[pq.aliases[alias]]


def test_a_collection_too_small_to_train_on_is_refused(tmp_path):
    path = corpus(tmp_path / "corpus.jsonl", 5, titles=False, punctuation=True)
    with pytest.raises(AheadrankError, match="enough text"):
        build_label_free_training_data(path, None, search=lambda q, d: {})


def test_sentence_passages_are_overlapping_windows_of_sentences_with_the_title():
    body = "Cats purr. Dogs bark loudly! Do fish sleep? Birds sing."
    assert sentence_passages("Pets", body, size=2) == [
        "Pets. Cats purr. Dogs bark loudly!",
        "Pets. Dogs bark loudly! Do fish sleep?",
        "Pets. Do fish sleep? Birds sing.",
    ]
    assert sentence_passages("", body, size=3) == [
        "Cats purr. Dogs bark loudly! Do fish sleep?",
        "Dogs bark loudly! Do fish sleep? Birds sing.",
    ]
    # lower-case sentences (Cranfield) are split too; a title ending in a stop gets no second one
    assert sentence_passages("On flow:", "the flow is slow. the wing is thin. it holds.", size=2) == [
        "On flow: the flow is slow. the wing is thin.",
        "On flow: the wing is thin. it holds.",
    ]


def test_a_short_body_is_one_passage_the_whole_document():
    assert sentence_passages("Title", "One sentence. Two.", size=2) == ["Title. One sentence. Two."]
    assert sentence_passages("", "no stop at all", size=1) == ["no stop at all"]
    with pytest.raises(ValueError, match="at least 1 sentence"):
        sentence_passages("t", "b", size=0)


def test_the_passage_teacher_adds_each_candidates_best_two_sentence_window(tmp_path, monkeypatch, tiny_base):
    """``--teacher fusion-passages``: beside BM25 and the bi-encoder, each candidate's best 2-sentence window by the
    bi-encoder's cosine with the query, 1/3 each; a candidate without text is an error, not a guess."""
    from aheadrank.rankers.dense import dense_encoder

    from aheadrank import baselines

    titled = {
        "long": ("Birds", "Cats purr softly. Dogs bark loudly. Fish swim in rivers. Owls hunt at night."),
        "short": ("", "Owls hunt at night."),
        "other": ("Rivers", "Water flows downhill. Salmon swim upstream in autumn. Bears wait for them."),
    }
    queries = {"q": "which birds hunt at night", "r": "salmon in rivers"}
    hits = {"q": [("long", 9.0), ("short", 7.0), ("other", 1.0)], "r": [("other", 5.0), ("long", 2.0)]}
    best = baselines.passage_cosines(queries, hits, titled, base=tiny_base)
    enc = dense_encoder(tiny_base)
    for q, listed in hits.items():
        qv = enc.encode_queries([queries[q]])[0]
        for (d, _), got in zip(listed, best[q], strict=True):
            windows = sentence_passages(*titled[d], size=2)
            assert len(windows) == (3 if d == "long" else 2 if d == "other" else 1)
            assert got == pytest.approx(float((enc.encode_documents(windows) @ qv).max()), abs=1e-5)

    monkeypatch.setattr(baselines, "dense_features", fake_features)
    aliases = {"pq:long": "long", "pq:other": "other"}
    qrels = {"q": {"pq:long": 1}, "r": {"pq:other": 1}}
    teacher = baselines.label_free_teacher(
        "unused", queries, hits, aliases, qrels, base=tiny_base, titled=titled
    )
    for q in queries:
        feats = fake_features(0, [q], hits)[q]
        feats.features["passage"] = best[q]
        want = baselines.feature_run({q: feats}, baselines.PASSAGE_FUSION)[q]
        want = {next(iter(qrels[q])) if d == aliases[next(iter(qrels[q]))] else d: s for d, s in want.items()}
        assert teacher[q] == pytest.approx(want)
    with pytest.raises(KeyError, match="no text for listed documents"):
        baselines.passage_cosines(queries, hits, {"long": titled["long"]}, base=tiny_base)


def short_corpus(path, n: int, words: tuple[int, int], seed: int = 0):
    """``n`` documents of ``words`` words each (catalogue items: no title, no sentence)."""
    rng = random.Random(seed)
    lines = [
        json.dumps({"_id": f"p{i}", "text": " ".join(rng.choices(WORDS, k=rng.randint(*words)))})
        for i in range(n)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_collection_of_short_texts_gets_keyword_queries(tmp_path):
    from aheadrank.indexer.pseudo_queries import KEYWORD_WORDS, short_text

    path = short_corpus(tmp_path / "items.jsonl", 60, (4, 9))
    pq = label_free_queries(path, max_queries=50, seed=2)
    assert pq.counts() == {"keywords": 50}  # none of them has text enough for a span (16+ words)
    for qid, query in pq.queries.items():
        (alias,) = pq.qrels[qid]
        source = pq.aliases[alias]
        words, doc = query.split(), pq.texts[source].split()
        assert KEYWORD_WORDS[0] <= len(words) <= min(KEYWORD_WORDS[1], len(doc) - 1)
        it = iter(doc)
        assert all(w in it for w in words)  # the document's own words, in their order
        assert pq.texts[alias] == pq.texts[source]
    assert label_free_queries(path, max_queries=50, seed=2).queries == pq.queries
    # a collection of long texts is not one of short texts: its queries are what they were (no keywords)
    long = corpus(tmp_path / "long.jsonl", 60, titles=False, punctuation=False)
    assert short_text(d.text for d in Collection(path)) and not short_text(d.text for d in Collection(long))
    assert "keywords" not in label_free_queries(long, max_queries=40).counts()


def test_a_short_text_collection_builds_its_training_data_and_too_few_words_is_refused(tmp_path):
    path = short_corpus(tmp_path / "items.jsonl", 60, (4, 9))

    def search(queries, depth):  # every document, in order
        return {q: [(f"p{i}", float(60 - i)) for i in range(depth)] for q in queries}

    data, hits, pq = build_label_free_training_data(path, None, max_queries=30, depth=10, search=search)
    assert len(data.queries) == 30 and set(pq.counts()) == {"keywords"}
    # two words of content or fewer a document: no keyword query can leave one out
    tiny = tmp_path / "tiny.jsonl"
    tiny.write_text(
        "".join(
            json.dumps({"_id": f"t{i}", "text": f"the {WORDS[i % 19]} of {WORDS[-1 - i % 19]}"}) + "\n"
            for i in range(60)
        )
    )
    with pytest.raises(AheadrankError, match="enough text"):
        build_label_free_training_data(tiny, None, search=search)
