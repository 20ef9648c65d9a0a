"""Process bootstrap: gevent monkey-patching, done once, before anything else imports.

The CLI, the gunicorn config and the tests import this module first. ``queue`` stays unpatched:
watchdog's observer breaks on gevent's patched ``queue.Queue`` (feasibility, "Extra finding"), and
the thread bridge uses the C ``_queue`` module anyway.
"""

from __future__ import annotations

from gevent import monkey

if not monkey.is_module_patched("socket"):
    monkey.patch_all(queue=False)

PATCHED = True
