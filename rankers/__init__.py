"""The ranker family: ``bert`` (cross-encoder baseline), ``mores`` (MORES/EARL), ``prettr``, ``tk``.

Every ranker has ``encode_documents``, ``encode_query``, ``score`` and ``score_pairs`` (DESIGN.md).
"""

from aheadrank.rankers.base import QueryState, Ranker
from aheadrank.rankers.blocks import QuantizedField
from aheadrank.rankers.checkpoint import (
    compute_fingerprint,
    init_ranker,
    load_config,
    load_ranker,
    read_fingerprint,
    save_checkpoint,
)
from aheadrank.rankers.config import KINDS, RankerConfig
from aheadrank.rankers.registry import RANKERS

__all__ = [
    "KINDS",
    "RANKERS",
    "QuantizedField",
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
