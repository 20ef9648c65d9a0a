"""Several worker processes serving one port set (gunicorn's arbiter, our worker class).

What is host-wide and who owns it (design.md, "Several processes"):

* **The run directory** (``TRITON_ACTOR_RUN_DIR``, made by the arbiter, 0700) holds one control socket per
  live worker (``workers/<pid>.sock``), a ready marker per worker (``ready/<pid>``), and the **journal**
  (``journal.json``): the host-wide desired state that is not in the repository's files -- explicit model
  loads and unloads with their overrides, versions that lost every instance in some worker (down in every
  worker until loaded again, ``hostwide.LostVersions``), shared-memory registrations, log and trace settings.
* **The journal owns that state**; a change is made by the worker whose client asked for it, under an
  exclusive ``flock`` on ``control.lock``: it applies the change on every registered worker (itself first),
  undoes it where it was applied if any worker fails (the request fails with that worker's error), and
  records it in the journal before the lock is released.
* **A worker that starts** registers its socket and reads the journal under the same lock, then loads its
  models and replays the journal before it accepts a connection: no change can fall between the two.
* **Reads that are sums** (statistics, metrics) gather every worker's own numbers over the control sockets
  when a client asks; nothing on the inference hot path crosses processes.
"""
