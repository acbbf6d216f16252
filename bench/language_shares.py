"""What the collection stage's language guess (indexer/language.py) sees on collections: per collection, English's
share of function words, the largest other list's, the letters outside the Latin script, and the guess. The
numbers behind ``MIN_SHARE`` (a guess needs another list at 8 % of all words and twice English's).

    .venv/bin/python bench/language_shares.py ../shared/data/scifact ../shared/data/cranfield \\
        ../shared/data/vaswani ../shared/data/msmarco-passages/passages.jsonl [--out bench/results/language-shares.json]

Prints a table and writes the JSON (with the command).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def shares(collection: str) -> dict:
    from aheadrank.indexer.collections import Collection, join_title_text
    from aheadrank.indexer.language import LanguageCounts

    counts = LanguageCounts()
    for _, title, body in Collection(collection).titled():
        counts.add(join_title_text(title, body))
    return {"collection": collection, "words_counted": counts.words, **counts.summary()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("collections", nargs="+")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "language-shares.json")
    args = ap.parse_args(argv)
    rows = [shares(c) for c in args.collections]
    print("| collection | words counted | English share | largest other | non-Latin letters | guess |")
    print("|---|---:|---:|---|---:|---|")
    for r in rows:
        ((code, share),) = r["other"].items()
        print(
            f"| {r['collection']} | {r['words_counted']:,} | {r['english_share']:.4f} | {code} {share:.4f} "
            f"| {r['non_latin_letters']:.4f} | {r['guess']} |"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"command": ["bench/language_shares.py", *sys.argv[1:]], "rows": rows}, indent=2)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
