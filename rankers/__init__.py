"""The ranker family: ``bert`` (cross-encoder baseline), ``mores`` (MORES/EARL), ``prettr``, ``tk``.

Every ranker has ``encode_documents``, ``encode_query``, ``score`` and ``score_pairs`` (DESIGN.md).
"""

from rankers.base import QueryState, Ranker
from rankers.checkpoint import (
    compute_fingerprint,
    init_ranker,
    load_config,
    load_ranker,
    read_fingerprint,
    save_checkpoint,
)
from rankers.config import KINDS, RankerConfig
from rankers.registry import RANKERS

__all__ = [
    "KINDS",
    "RANKERS",
    "QueryState",
    "Ranker",
    "RankerConfig",
    "compute_fingerprint",
    "init_ranker",
    "load_config",
    "load_ranker",
    "read_fingerprint",
    "save_checkpoint",
]
