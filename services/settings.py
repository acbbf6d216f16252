"""Service settings: one pydantic model, read from ``AHEADRANK_*`` environment variables; every field is
also a flag of ``aheadrank serve`` (aheadrank/cli/serve.py), which mirrors the same variables."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from aheadrank.rerank import QUERY_PIECES


class ServiceSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AHEADRANK_", extra="ignore")

    checkpoint: Path = Field(description="ranker checkpoint directory (query side + interaction)")
    store: Path | None = Field(None, description="representation store built by this checkpoint")
    index: Path | None = Field(None, description="Lucene BM25 index (candidates and raw text)")
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    device: str = Field("auto", description="auto (CUDA when present), cpu, cuda or cuda:N")
    threads: int | None = Field(None, ge=1, description="torch CPU threads (default: torch's choice)")

    # limits: every one answers 4xx with a message when exceeded
    max_candidates: int = Field(1000, ge=1, description="most candidates (depth or docids) per /v1/rerank")
    max_documents: int = Field(
        1_000,
        ge=1,
        description="most ad-hoc documents per request (/rerank, /v1 and /v2 rerank with documents; split into "
        "batches); the default fits the default deadline on 2 CPU cores with room for other requests' turns "
        "(services/README.md, 'Reliability: slow clients, and one request holding everyone')",
    )
    max_query_chars: int = Field(2_000, ge=1)
    max_document_chars: int = Field(
        100_000, ge=1, description="per ad-hoc document (/rerank, /v1 and /v2 rerank)"
    )
    max_docid_chars: int = Field(
        512, ge=1, description="per docid in `candidates` (checked before any lookup; longer: 413)"
    )
    max_json_depth: int = Field(
        32,
        ge=4,
        le=200,
        description="nesting of a request body's JSON (objects and arrays; checked on the raw body before "
        "it is parsed; deeper: 422)",
    )
    max_body_bytes: int = Field(32 * 1024 * 1024, ge=1024)
    max_queue: int = Field(64, ge=1, description="requests waiting for or holding the model; more get 503")
    default_depth: int = Field(100, ge=1)
    batch_size: int = Field(256, ge=1, description="stored candidates scored per forward pass")
    doc_batch_size: int = Field(
        16,
        ge=1,
        description="ad-hoc documents encoded per forward pass (/rerank): also the turn a request holds the model "
        "thread for before another request's chunk (on a GPU, larger is faster)",
    )
    max_chunks_per_doc: int = Field(
        10,
        ge=1,
        description="passages an ad-hoc document longer than the ranker's window is split into (ad-hoc texts; its "
        "score comes from theirs: --passage-aggregation); a request's Cohere `max_chunks_per_doc` may "
        "ask for fewer, not more; TEI's `truncate: true` reads the first passage only",
    )
    passage_overlap: int | None = Field(
        None, ge=0, description="word pieces consecutive passages share (default: a quarter of the window)"
    )
    passage_aggregation: Literal["maxp", "meanp", "first+max"] | None = Field(
        None,
        description="a long text's score from its passages': the best (maxp), their mean (meanp), or the mean of "
        "the first and the best (first+max); default: what the checkpoint's priors were fitted with (a label-free "
        "build's maxp, a judged one's first+max; bench/results/rag-long-texts/, long_inputs-passages.md)",
    )
    max_query_len: int = Field(
        QUERY_PIECES,
        ge=1,
        le=512,
        description="word pieces of a query the ranker reads, where its positions allow (at most what the base "
        "model's positions leave beside the document; PreTTR: the checkpoint's own, its stored document "
        "positions depend on it); /v1/info's model.query_len says what is read",
    )
    text_cache_entries: int = Field(
        4096,
        ge=0,
        description="ad-hoc texts (/rerank) whose online-encoded document side is kept for the next request "
        "(an LRU keyed by text digest and checkpoint fingerprint; 0: off); texts the store holds are never encoded",
    )
    text_cache_bytes: int = Field(
        256 * 1024 * 1024,
        ge=0,
        description="most bytes of tensors the ad-hoc text cache holds (0: off); the least recently used go first",
    )

    request_timeout_s: float = Field(
        30.0, gt=0, description="server-side deadline per request, from arrival (queue included): 504 after"
    )
    api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Bearer keys; empty: no auth"
    )
    api_keys_file: Path | None = Field(
        None,
        description="a file of Bearer keys (whitespace- or comma-separated, one or more a line; '#' comments): "
        "keeps keys out of `ps`",
    )
    priors: bool = Field(
        True,
        description="serve the neural score combined with the checkpoint's priors (BM25, dense, and the window "
        "prior where the store has sentence windows); "
        "off: the pure neural score (a request can also ask for it with `pure`)",
    )
    ad_hoc_windows: bool = Field(
        False,
        description="texts sent ad hoc (/rerank and the Cohere, Jina, TEI shapes) get the window prior too, where "
        "the priors weigh it: a text the store holds its stored windows, another its sentence windows cut and "
        "embedded online (cached); a relevant text behind an off-topic passage keeps more of its rank "
        "(bench/results/rag-long-texts/), a cold request costs more (bench/ad_hoc_windows_cost.py); off: "
        "neural and dense for every text",
    )
    read_timeout: float = Field(
        10.0, gt=0, description="seconds a client has to send a request's head (and between body chunks)"
    )
    max_connections: int = Field(
        1000, ge=1, description="open connections; beyond it the oldest idle or half-sent one is closed"
    )
    body_timeout: float = Field(
        20.0,
        gt=0,
        description="seconds a request's whole body has to arrive, from its head (after the API key and "
        "Content-Length are checked): 408 and the connection closed after",
    )
    send_timeout: float = Field(
        10.0,
        gt=0,
        description="seconds a response may wait for a client that does not read it (write buffer full): "
        "the connection is then dropped and its buffers freed",
    )
    interleave: bool = Field(
        True,
        description="requests on the model thread take turns a scoring chunk at a time (a small request waits "
        "for one chunk of each request ahead, not their whole runs); off: first come, first served",
    )
    java_heap: str = Field(
        "512m",
        pattern=r"^[1-9][0-9]*[kKmMgG]?$",
        description="maximum heap of the in-process JVM that runs BM25 (Pyserini), as -Xmx (e.g. 512m, 2g): "
        "Java's default, a quarter of the machine's memory, lets it grow for minutes under load",
    )
    onednn_cache_capacity: int = Field(
        8,
        ge=0,
        description="oneDNN primitive cache entries (ONEDNN_PRIMITIVE_CACHE_CAPACITY, set before the model "
        "runs); oneDNN's own default, 1024, keeps one compiled primitive per input shape seen and grows the heap",
    )
    malloc_trim_interval_s: float = Field(
        10.0,
        ge=0,
        description="give freed heap pages back to the system (glibc malloc_trim, on the model thread between "
        "requests) at most this often; 0: never",
    )
    native: str = Field(
        "all",
        description="which hand-written kernel families run (aheadrank/kernels/native.py): all, none, or a comma "
        "list of attention, layer, tk (or of families to leave out: -layer); built at load with the machine's C "
        "compiler; none: PyTorch's code for every stage",
    )
    cuda_graphs: bool = Field(
        True,
        description="on a GPU, the query side replayed from a CUDA graph per query length (captured at warm-up): "
        "one launch instead of ~140; off: run as usual",
    )
    verify_store: str = Field(
        "background",
        pattern=r"^(off|start|background)$",
        description="check the sha256 of every store shard (dense/, passages/ and windows/ included) as served: 'start' before serving "
        "(a mismatch refuses to start), 'background' after warm-up at the lowest CPU priority (a mismatch "
        "refuses that shard; /ready shows the progress), 'off': never (size/mtime checks and leases only)",
    )
    warmup: bool = True
    access_log: bool = True

    @field_validator("native", mode="before")
    @classmethod
    def _native_families(cls, value: object) -> str:
        """The kernel families in one spelling (``all``, ``none``, or a list in FAMILIES' order), read by the rule
        the kernels read ``AHEADRANK_NATIVE`` by (``native.parse_families``: an unknown family is an error)."""
        from aheadrank.kernels import native

        if isinstance(value, bool):
            value = "all" if value else "none"
        if not isinstance(value, str):
            raise ValueError("native: all, none, or a comma list of kernel families")
        return native.spelled(native.parse_families(value))

    @field_validator("api_keys", mode="before")
    @classmethod
    def _split_keys(cls, value: object) -> object:
        from aheadrank.services.keys import (
            parse_api_keys,  # the one rule for every source (an empty key is an error)
        )

        return parse_api_keys(value) if isinstance(value, (str, list, tuple)) else value

    @model_validator(mode="after")
    def _read_keys_file(self) -> ServiceSettings:
        if self.api_keys_file is not None:
            self.api_keys = [*self.api_keys, *read_keys_file(self.api_keys_file)]
            self.api_keys_file = None  # read once (a copy of these settings must not add them again)
        return self


def read_keys_file(path: Path) -> list[str]:
    """Keys from a file: whitespace- or comma-separated, one or more a line; '#' starts a comment."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read the API keys file {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ValueError(f"the API keys file {path} is not UTF-8 text (byte {exc.start})") from exc
    from aheadrank.services.keys import parse_api_keys

    lines = [line.split("#", 1)[0] for line in text.splitlines()]
    keys = parse_api_keys([line for line in lines if line.strip()])
    if not keys:
        raise ValueError(f"the API keys file {path} holds no keys")
    return keys
