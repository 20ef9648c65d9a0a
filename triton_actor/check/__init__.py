"""``triton-actor check REPOSITORY``: load every model of a repository before deploying it.

An entry-point tool above the server: each model is loaded by a real ``Server`` (EXPLICIT mode, no ports)
in a child process of its own (``one_model.py``), so a model that crashes, exits or hangs takes down only
its child. The parent (``command.py``) runs a few children at a time, adds what only fails elsewhere
(``static.py``: KIND_GPU on a host without a GPU, an unusable EXECUTION_ENV_PATH, imports the environment
lacks) and prints one line per model (``report.py``). See docs/check.md.
"""
