"""indexer: the offline half of aheadrank.

* ``indexer.collections`` — document collections (BEIR / Pyserini JSONL, TSV; plain, .gz, .zst), queries, qrels;
* ``indexer.bm25`` — the Pyserini / Lucene BM25 index build and ``Bm25Searcher``;
* ``indexer.language`` — whether a collection looks English (the build warns where it does not);
* its ``aheadrank`` CLI commands live in ``aheadrank/cli/indexer.py``.

Nothing heavy is imported here; Java is set up by ``indexer.bm25`` (the BM25 part) and starts only when a BM25 function needs it.
"""
