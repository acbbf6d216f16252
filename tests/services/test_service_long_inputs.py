"""Long inputs on /rerank against a real `aheadrank serve`: a text longer than the ranker's window is split into
passages and scored by its best one (MaxP), Cohere's max_chunks_per_doc / max_tokens_per_doc and TEI's truncate
say how much of it is read, and queries are read up to 64 word pieces where the ranker allows."""

from __future__ import annotations

import random

import httpx
import pytest
from services_testkit import Server

from aheadrank.passages import PassageOptions, split_passages

pytestmark = pytest.mark.slow
QUERY = "smoking increases the risk of lung cancer"


@pytest.fixture(scope="module")
def server(service_env):
    s = Server(
        "--checkpoint", str(service_env.checkpoint), "--no-warmup", "--no-access-log",
        "--passage-aggregation", "maxp",
    ).wait_ready()  # fmt: skip
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
    from transformers import BertTokenizerFast

    return BertTokenizerFast.from_pretrained(str(minilm_dir), local_files_only=True)


def scores(client, texts: list[str], query: str = QUERY, **extra) -> list[float]:
    r = client.post("/v2/rerank", json={"model": "m", "query": query, "documents": texts, **extra})
    assert r.status_code == 200, r.text
    out = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
    return [out[i] for i in range(len(texts))]


def long_texts(n: int, words: int) -> list[str]:
    from conftest import WORDS

    rng = random.Random(11)
    return [" ".join(rng.choice(WORDS) for _ in range(words)) for _ in range(n)]


def test_a_long_text_scores_as_its_best_passage(client, tokenizer):
    info = client.get("/v1/info").json()
    window = info["model"]["passage_window"]
    texts = long_texts(6, 3 * window)  # about 4 passages each
    split = split_passages(tokenizer, texts, PassageOptions(window=window))
    assert all(len(ps) > 1 for ps in split)
    got = scores(client, texts)
    later_best = 0
    for text_score, ps in zip(got, split, strict=True):
        alone = scores(client, ps)
        assert text_score == pytest.approx(max(alone), abs=1e-6)
        later_best += max(alone) > alone[0] + 1e-6  # the first window alone (truncation) would score less
    assert later_best, (
        "no text whose best passage is not its first: the check cannot tell MaxP from truncation"
    )
    # TEI's truncate: true and Cohere's max_chunks_per_doc: 1 read the first window only
    firsts = scores(client, [ps[0] for ps in split])
    assert scores(client, texts, max_chunks_per_doc=1) == pytest.approx(firsts, abs=1e-6)
    r = client.post("/rerank", json={"query": QUERY, "texts": texts, "truncate": True, "raw_scores": False})
    assert [x["score"] for x in sorted(r.json(), key=lambda x: x["index"])] == pytest.approx(firsts, abs=1e-6)
    two = [max(scores(client, ps[:2])) for ps in split]
    assert scores(client, texts, max_chunks_per_doc=2) == pytest.approx(two, abs=1e-6)


def test_max_tokens_per_doc_cuts_each_document(client, tokenizer):
    texts = long_texts(3, 400)
    cut = [ps[0] for ps in split_passages(tokenizer, texts, PassageOptions(window=512, max_pieces=30))]
    assert scores(client, texts, max_tokens_per_doc=30) == pytest.approx(scores(client, cut), abs=1e-6)


def test_queries_are_read_up_to_64_word_pieces(client):
    info = client.get("/v1/info").json()
    assert info["model"]["query_len"] == 64 and info["model"]["max_query_len"] == 16  # trained on 16
    words = long_texts(1, 60)[0].split()
    doc = ["Cigarette smoke and lung carcinoma in a cohort study of protein expression."]
    head = " ".join(words[:14])  # within the first 16 pieces
    assert scores(client, doc, head) != pytest.approx(scores(client, doc, " ".join(words[:40])), abs=1e-9)
    # beyond 64 pieces nothing more is read
    assert scores(client, doc, " ".join(words[:60] + ["cell"] * 40)) == pytest.approx(
        scores(client, doc, " ".join(words[:60] + ["cell"] * 80)), abs=1e-9
    )
