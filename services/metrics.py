"""Prometheus metrics of one app (own registry, so several apps in one process do not collide)."""

from __future__ import annotations

import re

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

STAGE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
COUNT_BUCKETS = (1, 10, 50, 100, 200, 500, 1000, 2000, 5000, 10000)


class ServiceMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "aheadrank_requests_total",
            "HTTP requests by endpoint and status",
            ["endpoint", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "aheadrank_request_seconds",
            "end-to-end request latency",
            ["endpoint"],
            buckets=STAGE_BUCKETS,
            registry=r,
        )
        self.stage = Histogram(
            "aheadrank_stage_seconds",
            "time per stage (queue, bm25, query, fetch, score, encode)",
            ["endpoint", "stage"],
            buckets=STAGE_BUCKETS,
            registry=r,
        )
        self.candidates = Histogram(
            "aheadrank_candidates",
            "candidates (or documents) per request",
            ["endpoint"],
            buckets=COUNT_BUCKETS,
            registry=r,
        )
        self.reranked = Histogram(
            "aheadrank_reranked_depth",
            "candidates actually re-ranked per request",
            buckets=COUNT_BUCKETS,
            registry=r,
        )
        self.errors = Counter("aheadrank_errors_total", "errors answered, by kind", ["kind"], registry=r)
        self.cancelled = Counter(
            "aheadrank_cancelled_total",
            "requests dropped on the model thread, by reason (client_disconnected, deadline) and stage "
            "(queued: before they started; running: between scoring chunks)",
            ["endpoint", "reason", "stage"],
            registry=r,
        )
        self.chunks = Counter(
            "aheadrank_chunks_total",
            "scoring chunks of requests, by outcome (scored; skipped: not scored because the request was dropped)",
            ["endpoint", "outcome"],
            registry=r,
        )
        self.queue = Gauge(
            "aheadrank_queue_depth",
            "requests waiting for or holding the model whose clients wait for the answer",
            registry=r,
        )
        self.turn = Histogram(
            "aheadrank_model_turn_seconds",
            "one turn of the model thread (a request's step up to its next scoring chunk, or a whole small job)",
            buckets=(0.001, 0.005, 0.02, 0.1, 0.5, 1, 2, 5, 10, 30),
            registry=r,
        )
        self.damaged_shards = Gauge(
            "aheadrank_store_damaged_shards",
            "store shards refused since they changed or broke under the server (see /ready and the log)",
            registry=r,
        )
        self.store_verified = Gauge(
            "aheadrank_store_verified_ratio",
            "share of the store's bytes (dense/, passages/ and windows/ included) whose sha256 was checked since start (--verify-store)",
            registry=r,
        )
        self.store_leased = Gauge(
            "aheadrank_store_leased",
            "1 when every store shard holds a file lease, 0 when some do not (a WARNING says why)",
            registry=r,
        )
        self.malloc_trim = Histogram(
            "aheadrank_malloc_trim_seconds",
            "time of each malloc_trim on the model thread (--malloc-trim-interval-s)",
            buckets=STAGE_BUCKETS,
            registry=r,
        )
        self.info = Gauge(
            "aheadrank_model_info", "the model served", ["model", "kind", "fingerprint", "device"], registry=r
        )

    def watch_text_cache(self, cache) -> None:
        """Export the ad-hoc text cache (services/texts.py ``TextCache``), read at each scrape."""
        self.registry.register(_TextCacheCollector(cache))

    def observe_stages(self, endpoint: str, seconds: dict[str, float]) -> None:
        for stage, value in seconds.items():
            if value > 0 or stage in ("queue", "score"):
                self.stage.labels(endpoint, stage).observe(value)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def sample_sum(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` in Prometheus text (what :meth:`ServiceMetrics.render` writes) whose
    labels include ``labels``; 0 when there are none."""
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}(?:{{(.*)}})? (\S+)$", line)
        if m and all(f'{k}="{v}"' in (m.group(1) or "") for k, v in labels.items()):
            total += float(m.group(2))
    return total


class _TextCacheCollector:
    """``aheadrank_text_cache_*``: the ad-hoc text cache's hits, misses, evictions, entries and bytes, and
    ``aheadrank_texts_total{source}``: ad-hoc texts served from the store, the cache, or encoded online."""

    def __init__(self, cache) -> None:
        self.cache = cache

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        s = self.cache.stats()
        for name, help_text in (
            ("hits", "ad-hoc texts found in the cache of online-encoded texts"),
            ("misses", "ad-hoc texts looked for in the cache and not found (then encoded)"),
            ("evictions", "cache entries dropped to keep within --text-cache-entries / --text-cache-bytes"),
        ):
            yield CounterMetricFamily(f"aheadrank_text_cache_{name}", help_text, value=s[name])
        yield GaugeMetricFamily("aheadrank_text_cache_entries", "texts in the cache", value=s["entries"])
        yield GaugeMetricFamily(
            "aheadrank_text_cache_bytes", "bytes of tensors in the cache", value=s["bytes"]
        )
        texts = CounterMetricFamily(
            "aheadrank_texts",
            "distinct ad-hoc texts per request, by where their document side came from (stored: the store "
            "holds the text; cached; encoded: online)",
            labels=["source"],
        )
        for source, n in s["texts"].items():
            texts.add_metric([source], n)
        yield texts
