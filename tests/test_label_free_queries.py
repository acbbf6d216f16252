"""indexer/pseudo_queries.py: pseudo-queries from a collection with no titles are its own sentences, else spans."""

from __future__ import annotations

import json

from aheadrank.indexer.pseudo_queries import SENTENCE_WORDS, label_free_queries, sentences


def test_untitled_documents_give_sentence_queries_cut_from_their_own_text(tmp_path):
    body = (
        "The wing of the aircraft was tested in a supersonic tunnel. "
        "Pressure along the chord was measured at twelve stations. "
        "The results agree with the linear theory within a few percent."
    )
    lines = [
        json.dumps({"_id": f"d{i}", "title": "", "text": f"{body} Run {i} ends here now."}) for i in range(8)
    ]
    path = tmp_path / "corpus.jsonl"
    path.write_text("\n".join(lines) + "\n")
    lf = label_free_queries(path, max_queries=5, seed=3)
    assert len(lf.queries) >= 3 and set(lf.kinds.values()) == {"sentence"}
    for qid, q in lf.queries.items():
        docid = qid.split(":", 1)[1]
        assert q in sentences(f"{body} Run {docid[1:]} ends here now.")
        assert SENTENCE_WORDS[0] <= len(q.split()) <= SENTENCE_WORDS[1]
        (alias,) = lf.qrels[qid]
        assert lf.aliases[alias] == docid


def test_texts_without_sentence_stops_give_span_queries(tmp_path):
    words = " ".join(f"word{i}" for i in range(40))
    (tmp_path / "c.jsonl").write_text(json.dumps({"_id": "a", "title": "", "text": words}) + "\n")
    lf = label_free_queries(tmp_path / "c.jsonl", max_queries=3)
    (q,) = lf.queries.values()
    assert lf.kinds == {"span:a": "span"} and q in words and 6 <= len(q.split()) <= 12
