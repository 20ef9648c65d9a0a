"""Metrics: Triton's Prometheus families and a StatsD push, both computed from plain-data snapshots.

Nothing here runs on the inference hot path. The schedulers keep their counters in
:class:`~triton_actor.metrics.statistics.VersionStats` (as they do for the statistics extension); at scrape or push
time :mod:`..host.metrics_snapshot` copies them out of every worker (``host.gather("metrics")``), :mod:`.families` sums
them over workers into ``prometheus_client`` metric families, :mod:`.exposition` writes the text and
:mod:`.statsd_push` turns the same totals into StatsD counters, timers and gauges.
"""
