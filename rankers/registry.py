"""Ranker kind -> class."""

from __future__ import annotations

from rankers.base import Ranker
from rankers.bert import BertRanker
from rankers.mores import MoresRanker
from rankers.prettr import PrettrRanker
from rankers.tk import TkRanker

RANKERS: dict[str, type[Ranker]] = {
    "bert": BertRanker,
    "mores": MoresRanker,
    "prettr": PrettrRanker,
    "tk": TkRanker,
}
