"""indexer: the offline half of aheadrank.

* ``indexer.collections`` — document collections (BEIR / Pyserini JSONL, TSV; plain, .gz, .zst), queries, qrels;
* ``indexer.bm25`` — the Pyserini / Lucene BM25 index build and ``Bm25Searcher``;
* ``indexer.commands`` — the ``aheadrank`` CLI commands of this part.

Nothing heavy is imported here; Java starts only when a BM25 function needs it (``indexer.java``).
"""
