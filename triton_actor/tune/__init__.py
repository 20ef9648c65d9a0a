"""``triton-actor tune``: find the configuration of one model that serves it best on this host.

A sweep of candidate configurations (instances and their kind, ``max_batch_size``, dynamic batching,
preferred batch sizes, queue delay; for an ensemble its composing models'), each loaded into a running
server through the load API's ``config`` override (load-then-swap, no restart; only ``--workers`` restarts a
server started here) and measured by a load generator in processes of its own. The pieces, top first:

* ``command.py``: the command line, the run (server, search, report) and Ctrl-C;
* ``target.py``: the server under test, started here in EXPLICIT mode or attached with ``--url``;
* ``measure.py``: one point = load the candidate, run the load generator, read the server's statistics;
* ``loadgen.py``: the load generator, ``python -m triton_actor.tune.loadgen`` (closed loop, or an open loop
  of Poisson arrivals timed from the schedule; tritonclient);
* ``search.py``: the search over candidates, pure (it is given a ``measure`` function);
* ``points.py``: candidates, measured points, the objective and the Pareto front, pure values;
* ``config_writer.py``: a candidate applied to a ``ModelConfig``, ``configs/tuned.pbtxt``;
* ``report.py`` (+ ``plots.py``): the terminal table, the CSV, the PNG plots and ``index.html``;
* ``progress.py``: the progress line and its ETA.

It sits just below the entry point: it uses the repository files' parser and the protocol's tables, and
talks to the server only over the wire, as any client does.
"""
