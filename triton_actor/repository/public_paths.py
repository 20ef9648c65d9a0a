"""How the server's own folders are named in what a client reads: error texts and the index's reasons.

A Python model's error names its files where the server keeps them: Triton's python backend answers a
model's exception with its Python traceback (``pb_stub.cc`` returns ``py::error_already_set::what()``,
``"<Type>: <message>\\n\\nAt:\\n  <file>(<line>): <function>"``, every frame of it). For a model of a
repository on disk those paths are the user's own, and users need them to find the line. Two folders are
the server's own: a load request's files are written to a temporary folder (``repository/overrides.py``),
and an object-store repository is read from a local copy (``repository/remote.py``). They are named for
what the client gave instead: ``<load request>`` and the repository's URL. Other frames (the standard
library, site-packages) keep their paths, as Triton shows them; the server's log keeps every path.
"""

from __future__ import annotations

PublicPaths = tuple[tuple[str, str], ...]  # (a folder of the server's own, the name a client reads for it)
LOAD_REQUEST = "<load request>"


def public_text(text: str, paths: PublicPaths) -> str:
    """``text`` with each of the server's folders in ``paths`` replaced by its public name."""
    for folder, name in paths:
        if folder in text:
            text = text.replace(folder, name)
    return text
