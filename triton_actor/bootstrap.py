"""Process bootstrap: gevent monkey-patching, done once, before anything else imports.

The CLI, the gunicorn config and the tests import this module first. Two modules stay unpatched:

* ``queue``: watchdog's observer breaks on gevent's patched ``queue.Queue`` (feasibility, "Extra
  finding"), and the thread bridge uses the C ``_queue`` module anyway;
* ``subprocess``: gevent's version only works on the hub's (default) loop, but model code runs on
  instance threads and does spawn processes (``import torch`` runs ``ldconfig`` through
  ``ctypes.util.find_library``; a ``model.py`` may call ``subprocess.run``). The hub never spawns.
"""

from __future__ import annotations

from gevent import monkey

if not monkey.is_module_patched("socket"):
    monkey.patch_all(queue=False, subprocess=False)

PATCHED = True
