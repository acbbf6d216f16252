"""Title pseudo-queries: the title out of every text, shared titles judged together, bad lines skipped."""

from __future__ import annotations

import json

from aheadrank.indexer.collections import Collection, join_title_text
from aheadrank.indexer.pseudo_queries import QID_PREFIX, title_queries

RECORDS = [
    {"_id": "a", "title": "Insulin resistance in obese mice", "text": "We measured glucose uptake."},
    {"_id": "b", "title": "Short title", "text": "Too short to be a query."},
    {"_id": "c", "title": "insulin resistance in obese mice.", "text": "A second study, same title."},
    {"_id": "d", "title": "A title with no body at all", "text": ""},
    {"_id": "e", "title": "", "text": "No title: a body only."},
    {"_id": "f", "title": "Vaccine response in the elderly", "text": "Antibody titres fell with age."},
]


def write_corpus(path, records, extra_lines=()):
    lines = [json.dumps(r) for r in records] + list(extra_lines)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_titles_become_queries_for_their_bodies(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.jsonl", RECORDS, ["{not json", '{"_id": "g"}'])
    pq = title_queries(corpus)
    # a: one query for the title a and c share (first spelling kept), judged for both; f: its own
    assert pq.queries == {
        QID_PREFIX + "a": "Insulin resistance in obese mice",
        QID_PREFIX + "f": "Vaccine response in the elderly",
    }
    assert pq.qrels == {QID_PREFIX + "a": {"a": 1, "c": 1}, QID_PREFIX + "f": {"f": 1}}
    # the title is out of every text (a document without a body keeps its title: it is nobody's positive)
    assert pq.texts == {
        "a": "We measured glucose uptake.",
        "b": "Too short to be a query.",
        "c": "A second study, same title.",
        "d": "A title with no body at all",
        "e": "No title: a body only.",
        "f": "Antibody titres fell with age.",
    }
    # the collection's own documents are unchanged: title and body joined by the one rule, bad lines counted
    coll = Collection(corpus)
    docs = {d.docid: d.text for d in coll}
    assert docs["a"] == join_title_text("Insulin resistance in obese mice", "We measured glucose uptake.")
    assert docs["d"] == "A title with no body at all" and len(docs) == 6
    assert coll.report.problems == 2


def test_max_queries_draws_the_same_subset_for_a_seed(tmp_path):
    records = [{"_id": f"d{i}", "title": f"title number {i} here", "text": f"body {i}"} for i in range(40)]
    corpus = write_corpus(tmp_path / "corpus.jsonl", records)
    one, two = title_queries(corpus, max_queries=10, seed=3), title_queries(corpus, max_queries=10, seed=3)
    other = title_queries(corpus, max_queries=10, seed=4)
    assert one.queries == two.queries and len(one.queries) == 10
    assert set(one.queries) <= set(title_queries(corpus).queries)
    assert one.queries != other.queries
    assert len(one.texts) == 40  # every document can still be a negative
