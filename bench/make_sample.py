"""Regenerate the bundled demo collection ``aheadrank/data/scifact-sample`` from the full SciFact copy.

Deterministic: the same source and options give byte-identical files. Keeps ``--train-queries`` train and
``--test-queries`` test queries (a seeded sample), every document judged for them, and random other
documents up to ``--docs`` in total. Lines are copied verbatim, in the source's order.

    .venv/bin/python bench/make_sample.py [--source ../shared/data/scifact] [--out aheadrank/data/scifact-sample]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SOURCE = REPO.parent / "shared" / "data" / "scifact"
DEFAULT_OUT = REPO / "aheadrank" / "data" / "scifact-sample"
QRELS_HEADER = "query-id\tcorpus-id\tscore"

SOURCE_MD = """\
# SciFact sample (BEIR format) — the bundled demo collection

A small, deterministic sample of SciFact (Wadden et al., "Fact or Fiction: Verifying Scientific Claims",
EMNLP 2020) in BEIR layout, for demos and tests:

- corpus.jsonl: {docs:,} abstracts (`_id`, `title`, `text`): every document judged for the kept queries, plus
  randomly chosen other documents;
- queries.jsonl: {queries:,} claims (`_id`, `text`, `metadata`): {train:,} from the train split, {test:,} from the test split;
- qrels/train.tsv ({train_rows:,} rows), qrels/test.tsv ({test_rows:,} rows): binary judgements, header `query-id corpus-id score`.

Lines are copied verbatim from the full local copy (5,183 documents, 1,109 claims), in its order.
Regenerate with `python bench/make_sample.py` (seed {seed}).

## Source of the full copy

- queries.jsonl, qrels/train.tsv, qrels/test.tsv: the BEIR originals (BEIR, Thakur et al., NeurIPS 2021
  Datasets and Benchmarks), as stored in github kevinluong21/csi4107-assignment1 @
  3288aed23d9e2405be3e938d7c294b0775a804d8; qrels/test.tsv is identical to castorini/anserini-tools
  qrels.beir-v1.0.0-scifact.test.txt.
- corpus.jsonl: rebuilt from the allenai/scifact "corpus" export (github sumithra-p-v/claimverifier @
  b42f1c3444b28884ddcfadffafbfe223646c6c37, data/scifact.zip -> corpus_train.csv): `_id` = doc_id,
  `title` = title.strip(), `text` = the abstract's sentences joined with single spaces; checked
  character-identical to the BEIR corpus.jsonl.

## Licence

allenai/scifact (LICENSE.md @ 7e07702341da0c3d274baa104abb9585b30d3af7): claims and annotations CC BY 4.0;
abstracts from S2ORC under ODC-By 1.0. (The BEIR paper's table lists SciFact as CC BY-NC 2.0.)
Attribution: David Wadden, Shanchuan Lin, Kyle Lo, Lucy Lu Wang, Madeleine van Zuylen, Arman Cohan,
Hannaneh Hajishirzi — SciFact, Allen Institute for AI.
"""


def read_qrels(path: Path) -> list[tuple[str, str, str]]:
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.strip() == QRELS_HEADER:
            continue
        qid, docid, score = line.split("\t")
        rows.append((qid, docid, score))
    return rows


def jsonl_ids(path: Path) -> list[tuple[str, str]]:
    """(``_id``, verbatim line) for every line of a JSONL file."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return [(json.loads(line)["_id"], line) for line in lines if line.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--docs", type=int, default=1000)
    parser.add_argument("--train-queries", type=int, default=150)
    parser.add_argument("--test-queries", type=int, default=50)
    parser.add_argument("--seed", type=int, default=4)
    args = parser.parse_args()

    rng = random.Random(args.seed)
    qrels = {split: read_qrels(args.source / "qrels" / f"{split}.tsv") for split in ("train", "test")}
    wanted = {"train": args.train_queries, "test": args.test_queries}
    kept_qids = {
        split: set(rng.sample(sorted({qid for qid, _, _ in rows}, key=int), wanted[split]))
        for split, rows in qrels.items()
    }
    kept_rows = {split: [r for r in rows if r[0] in kept_qids[split]] for split, rows in qrels.items()}
    judged = {docid for rows in kept_rows.values() for _, docid, _ in rows}

    corpus = jsonl_ids(args.source / "corpus.jsonl")
    others = sorted((docid for docid, _ in corpus if docid not in judged), key=int)
    if len(judged) > args.docs:
        raise SystemExit(f"{len(judged)} judged documents do not fit in --docs {args.docs}")
    kept_docs = judged | set(rng.sample(others, args.docs - len(judged)))

    all_qids = kept_qids["train"] | kept_qids["test"]
    queries = [line for qid, line in jsonl_ids(args.source / "queries.jsonl") if qid in all_qids]
    if len(queries) != len(all_qids):
        raise SystemExit("some kept query ids have no text in queries.jsonl")

    out: Path = args.out
    (out / "qrels").mkdir(parents=True, exist_ok=True)
    (out / "corpus.jsonl").write_text(
        "".join(line + "\n" for d, line in corpus if d in kept_docs), encoding="utf-8"
    )
    (out / "queries.jsonl").write_text("".join(line + "\n" for line in queries), encoding="utf-8")
    for split, rows in kept_rows.items():
        text = QRELS_HEADER + "\n" + "".join("\t".join(row) + "\n" for row in rows)
        (out / "qrels" / f"{split}.tsv").write_text(text, encoding="utf-8")
    (out / "SOURCE.md").write_text(
        SOURCE_MD.format(
            docs=len(kept_docs),
            queries=len(queries),
            train=len(kept_qids["train"]),
            test=len(kept_qids["test"]),
            train_rows=len(kept_rows["train"]),
            test_rows=len(kept_rows["test"]),
            seed=args.seed,
        ),
        encoding="utf-8",
    )
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(
        f"wrote {out}: {len(kept_docs)} docs ({len(judged)} judged), {len(queries)} queries, "
        f"{len(kept_rows['train'])}+{len(kept_rows['test'])} qrels rows, {size / 1e6:.2f} MB"
    )


if __name__ == "__main__":
    main()
