"""Ranker configuration: the ranker kind and every hyper-parameter, saved as ``config.json`` in a checkpoint."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from aheadrank.errors import CheckpointError

CONFIG_FORMAT = 1
BERT_KEYS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
    "type_vocab_size",
    "layer_norm_eps",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
)


@dataclass
class RankerConfig:
    """All hyper-parameters of one ranker. Options of other kinds are ``None``.

    Lengths count word pieces and exclude special tokens: a query is ``[CLS] q [SEP]`` with
    ``len(q) <= max_query_len``; a document has ``len(d) <= max_doc_len`` word pieces.
    """

    kind: str
    bert: dict[str, Any]  # the base encoder's shape (BertConfig fields in BERT_KEYS)
    max_query_len: int = 16
    max_doc_len: int = 128
    # MORES / EARL
    ibs: int | None = None  # K interaction blocks
    pooling: str | None = None  # "cls" (ClsPool) or "mean" (AvePool)
    tied: bool | None = None  # query and document modules share weights (EARL "Tied")
    # MORES / PreTTR: add a learned multiple of cos(pooled query, pooled document) to the score (the base's
    # own bi-encoder similarity at initialisation; None in checkpoints written before it existed = off)
    sim: bool | None = None
    # PreTTR
    layer: int | None = None  # l: document and query are kept apart in layers 1..l
    compress: int | None = None  # e: compressed dims (0 = no compressor)
    # TK
    tk_layers: int | None = None
    tk_heads: int | None = None
    tk_ffn: int | None = None
    # TK's contextualisation starts from the base's first tk_layers layers and its embedding (word + learned
    # positions, LayerNorm) instead of small random layers over word embeddings + sinusoids (None/False: the latter)
    tk_base: bool | None = None
    # with tk_base, each text is read between [CLS] and [SEP], as the base was trained, and only its own pieces are
    # matched (None/False: the text alone, as every checkpoint written before it existed; left out of config.json
    # unless on, so those are unchanged)
    tk_specials: bool | None = None
    # the options of a kind whose own options are not fields above (a kind registered after these; read as
    # attributes, ``config.width``); left out of config.json when empty, so older checkpoints are unchanged
    options: dict[str, Any] = field(default_factory=dict)
    # provenance (not a hyper-parameter of the math)
    base: str = ""
    format: int = CONFIG_FORMAT
    extra: dict[str, Any] = field(default_factory=dict)

    def __getattr__(
        self, name: str
    ) -> Any:  # only for names that are not fields: a registered kind's options
        options = self.__dict__.get("options") or {}
        if name in options:
            return options[name]
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    @classmethod
    def create(cls, kind: str, bert: dict[str, Any], **options: Any) -> RankerConfig:
        """A config of ``kind``: options that are fields go there, a kind's other options into ``options``."""
        names = {f.name for f in dataclasses.fields(cls)}
        own = {k: v for k, v in options.items() if k not in names}
        return cls(kind=kind, bert=bert, options=own, **{k: v for k, v in options.items() if k in names})

    @property
    def hidden(self) -> int:
        return int(self.bert["hidden_size"])

    @property
    def n_layers(self) -> int:
        return int(self.bert["num_hidden_layers"])

    def validate(self) -> RankerConfig:
        def bad(msg: str) -> CheckpointError:
            return CheckpointError(f"invalid {self.kind} ranker config: {msg}")

        if self.kind not in _specs():
            raise CheckpointError(f"unknown ranker kind {self.kind!r}; expected one of {', '.join(_specs())}")
        missing = [k for k in BERT_KEYS if k not in self.bert]
        if missing:
            raise bad(f"base config lacks {missing}")
        if self.format > CONFIG_FORMAT:
            raise bad(f"config format {self.format} is newer than this aheadrank ({CONFIG_FORMAT})")
        if not 1 <= self.max_query_len <= 128:
            raise bad(f"max_query_len must be in 1..128, got {self.max_query_len}")
        if not 1 <= self.max_doc_len <= 512:
            raise bad(f"max_doc_len must be in 1..512, got {self.max_doc_len}")
        positions = int(self.bert["max_position_embeddings"])
        L = self.n_layers
        if self.kind in ("bert", "prettr"):
            need = self.max_query_len + self.max_doc_len + 3
            if need > positions:
                raise bad(
                    f"[CLS] q [SEP] d [SEP] needs {need} positions but the base has {positions}; "
                    f"lower max_doc_len to {positions - self.max_query_len - 3}"
                )
        if self.kind == "mores":
            if self.max_doc_len + 2 > positions:
                raise bad(f"[CLS] d [SEP] needs {self.max_doc_len + 2} positions, the base has {positions}")
            if self.ibs is None or not 1 <= self.ibs <= min(4, L):
                raise bad(f"ibs (K) must be in 1..{min(4, L)} for a {L}-layer base, got {self.ibs}")
            if self.pooling not in ("cls", "mean"):
                raise bad(f"pooling must be 'cls' or 'mean', got {self.pooling!r}")
        if self.sim and self.kind not in ("mores", "prettr"):
            raise bad("sim (the similarity residual) exists for mores and prettr only")
        if self.kind == "prettr":
            if self.layer is None or not 1 <= self.layer <= L - 1:
                raise bad(f"layer (l) must be in 1..{L - 1} for a {L}-layer base, got {self.layer}")
            if self.compress is None or not 0 <= self.compress <= self.hidden:
                raise bad(f"compress (e) must be in 0..{self.hidden}, got {self.compress}")
        if self.kind == "tk":
            if not self.tk_layers or self.tk_layers < 1:
                raise bad(f"tk_layers must be >= 1, got {self.tk_layers}")
            if not self.tk_heads or self.hidden % self.tk_heads:
                raise bad(f"tk_heads must divide the embedding size {self.hidden}, got {self.tk_heads}")
            if self.tk_base:
                shape = (int(self.bert["num_attention_heads"]), int(self.bert["intermediate_size"]))
                if self.tk_layers > L:
                    raise bad(
                        f"tk_base takes the base's first tk_layers layers; it has {L}, not {self.tk_layers}"
                    )
                if (self.tk_heads, self.tk_ffn) != shape:
                    raise bad(f"tk_base takes the base's layers: tk_heads and tk_ffn must be {shape}")
                if self.tk_specials and self.max_doc_len + 2 > positions:
                    raise bad(
                        f"[CLS] d [SEP] needs {self.max_doc_len + 2} positions, the base has {positions}"
                    )
            elif self.tk_specials:
                raise bad("tk_specials reads a text as the base was trained: it needs tk_base")
        return self

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        if not data["options"]:
            del data["options"]
        if not data["tk_specials"]:
            del data["tk_specials"]
        return json.dumps(data, indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RankerConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise CheckpointError(f"config.json has unknown keys {unknown} (written by a newer aheadrank?)")
        lacking = [key for key in ("kind", "bert") if key not in data]
        if lacking:
            raise CheckpointError(f"config.json lacks {' and '.join(repr(k) for k in lacking)}")
        return cls(**data).validate()


def _specs() -> dict:
    from aheadrank.rankers.registry import SPECS  # the registry imports the rankers, which import this module

    return SPECS


def kind_options() -> dict[str, tuple[str, ...]]:
    """Each registered kind's own options (the fields of its spec's options dataclass)."""
    return {kind: spec.option_names() for kind, spec in _specs().items()}


def default_options(kind: str) -> dict[str, Any]:
    """The defaults ``init-ranker`` uses for a kind's own options (its spec's options dataclass)."""
    from aheadrank.rankers.registry import spec_of

    return spec_of(kind).defaults()


def resolve_options(kind: str, options: dict[str, Any], bert: dict[str, Any]) -> dict[str, Any]:
    """The kind's defaults overridden by the ``options`` given (None: not given); TK with ``tk_base`` takes
    the base's head count and FFN width unless they are given."""
    given = {k: v for k, v in options.items() if v is not None}
    opts = {**default_options(kind), **given}
    if kind == "tk" and opts.get("tk_base"):
        if "tk_heads" not in given:
            opts["tk_heads"] = int(bert["num_attention_heads"])
        if "tk_ffn" not in given:
            opts["tk_ffn"] = int(bert["intermediate_size"])
    return opts


def foreign_options(kind: str, options: dict[str, Any]) -> list[str]:
    """The options set (not None) that belong to another kind than ``kind``: the one rule, which every caller
    enforces by refusing them (:func:`check_options`; the CLI names its flags instead)."""
    by_kind = kind_options()
    own = set(by_kind.get(kind, ()))
    others = {name for names in by_kind.values() for name in names} - own
    return [name for name, value in options.items() if value is not None and name in others]


def check_options(kind: str, options: dict[str, Any]) -> None:
    foreign = foreign_options(kind, options)
    if foreign:
        raise CheckpointError(f"{', '.join(foreign)} does not apply to a {kind} ranker")
