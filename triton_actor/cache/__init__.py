"""The response cache (Triton's ``--cache-config``): answers of models that enable ``response_cache``, by request.

``local`` keeps them in this process, least recently used out first when the byte budget is spent
(:mod:`.local`); ``redis`` keeps them in a Redis server every worker and every server pointed at it
shares (:mod:`.redis_store`). :mod:`.keys` makes the key of a request, :mod:`.entry` the stored value,
:mod:`.settings` checks the flags. The per-version front that looks up, counts and inserts is
``actors/model/cached.py``; a server makes its one store at start (``create``), each worker its own.
"""

from __future__ import annotations

from .local import LocalCache
from .settings import check, create

__all__ = ["LocalCache", "check", "create"]
