"""The ranker family: ``bert`` (cross-encoder baseline), ``mores`` (MORES/EARL), ``prettr``, ``tk``.

Every ranker has ``encode_documents``, ``encode_query``, ``score`` and ``score_pairs`` (DESIGN.md).
"""

from aheadrank.rankers.base import QueryState, Ranker
from aheadrank.rankers.checkpoint import (
    compute_fingerprint,
    init_ranker,
    load_config,
    load_ranker,
    read_fingerprint,
    save_checkpoint,
)
from aheadrank.rankers.config import RankerConfig
from aheadrank.rankers.registry import RANKERS, SPECS, register
from aheadrank.rankers.spec import RankerSpec, option

from aheadrank.kernels.stored import QuantizedField

__all__ = [
    "RANKERS",
    "SPECS",
    "QuantizedField",
    "QueryState",
    "Ranker",
    "RankerConfig",
    "RankerSpec",
    "compute_fingerprint",
    "init_ranker",
    "load_config",
    "load_ranker",
    "option",
    "read_fingerprint",
    "register",
    "save_checkpoint",
]
