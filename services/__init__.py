"""The online half: a FastAPI re-ranking service over Pyserini BM25 and the representation store.

``aheadrank serve`` (aheadrank/cli/serve.py) loads a :class:`RerankBackend`, warms it up and serves
:func:`create_app`.
"""

from aheadrank.services.backend import RerankBackend
from aheadrank.services.settings import ServiceSettings


def create_app(backend: RerankBackend):
    from aheadrank.services.app import create_app as _create

    return _create(backend)


__all__ = ["RerankBackend", "ServiceSettings", "create_app"]
