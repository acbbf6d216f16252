"""Short-text collections with real judgments: a BEIR collection with titles, rewritten as its titles alone.

A catalogue of product names or a list of FAQ questions is a collection of short texts (a dozen words or fewer,
no body). None of our judged collections is one, but SciFact's and Cranfield's titles are (median 12 words each):
``<name>-titles`` keeps the collection's queries and qrels and makes each document its title alone, as the text
(documents without a title are left out, so their judgments count as misses, as for a user who has only the
titles). With ``--words N``, ``<name>-titles<N>``: each title cut to its first N words, a collection in which no
document has text enough for the span queries of longer texts (16+ words), as in a catalogue of product names.
What ``bench/label_free.py --data DIR --collections scifact-titles ...`` builds and evaluates.

    .venv/bin/python bench/titles_only.py --out work/titles scifact cranfield [--words 8]
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def titles_only(source: Path, out: Path, words: int | None = None) -> dict:
    """Write ``out`` (a BEIR folder) from ``source``: each titled document as its title (its first ``words``
    words), queries and qrels as they are. Returns the counts."""
    if (out / "corpus.jsonl").is_file():
        shutil.rmtree(out)
    (out / "qrels").mkdir(parents=True, exist_ok=True)
    kept = dropped = total = 0
    with open(source / "corpus.jsonl", encoding="utf-8") as f, open(out / "corpus.jsonl", "w") as g:
        for line in f:
            doc = json.loads(line)
            title = " ".join(str(doc.get("title") or "").split()[:words])
            if not title:
                dropped += 1
                continue
            g.write(json.dumps({"_id": doc["_id"], "title": "", "text": title}) + "\n")
            kept += 1
            total += len(title.split())
    shutil.copy(source / "queries.jsonl", out / "queries.jsonl")
    for qrels in (source / "qrels").glob("*.tsv"):
        shutil.copy(qrels, out / "qrels" / qrels.name)
    return {"documents": kept, "untitled_dropped": dropped, "mean_words": round(total / max(kept, 1), 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("collections", nargs="+")
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--out", type=Path, default=ROOT / "work" / "titles")
    ap.add_argument("--words", type=int, default=None, help="cut each title to its first N words")
    args = ap.parse_args(argv)
    for name in args.collections:
        out = args.out / f"{name}-titles{args.words or ''}"
        print(f"{out}: {titles_only(args.data / name, out, args.words)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
