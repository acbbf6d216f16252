"""Ranker kind -> class."""

from __future__ import annotations

from aheadrank.rankers.base import Ranker
from aheadrank.rankers.bert import BertRanker
from aheadrank.rankers.mores import MoresRanker
from aheadrank.rankers.prettr import PrettrRanker
from aheadrank.rankers.tk import TkRanker

RANKERS: dict[str, type[Ranker]] = {
    "bert": BertRanker,
    "mores": MoresRanker,
    "prettr": PrettrRanker,
    "tk": TkRanker,
}
