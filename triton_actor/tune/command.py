"""``triton-actor tune``: the command line and one run, start to report.

Start the server (or attach with ``--url``), read the model's served config, search, then write: the
report folder always; ``configs/tuned.pbtxt`` beside ``config.pbtxt`` when the server was started here,
or with ``--url`` only when ``--apply`` is given (which also loads the pick); without ``--apply`` an
attached server gets its original config back. Ctrl-C stops the search and still writes the report of
the points measured. Runs in the main thread; exit status 0 with a pick, 1 without one, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ..errors import TritonError
from . import config_writer, report
from .measure import MIN_WINDOWS, Measurer, Timing
from .points import OBJECTIVES, Candidate, Point, pick
from .progress import Progress
from .search import Search, Space, default_space
from .target import Target

CONFIRM_ROUNDS = 2  # back-to-back rounds of (shipped, pick) that decide whether the pick stands


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(sorted({int(v) for v in text.split(",") if v.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"expected non-negative integers, got {text!r}")
    return values


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="triton-actor tune", description="Find the configuration that serves a model best.")
    p.add_argument("--model-repository", type=Path, help="the repository (required unless --url)")
    p.add_argument("--model", required=True)
    p.add_argument("--url", help="attach to a running server (EXPLICIT mode) instead of starting one")
    p.add_argument("--apply", action="store_true", help="with --url: load the pick and write configs/tuned.pbtxt")
    p.add_argument("--protocol", choices=("http", "grpc"), default="http")
    p.add_argument("--latency-budget-ms", type=float, help="the p99 latency a pick must stay within")
    p.add_argument("--objective", choices=OBJECTIVES, default="throughput")
    p.add_argument("--concurrency", type=_ints, default=(1, 4, 16), help="client concurrencies (default 1,4,16)")
    p.add_argument("--max-minutes", type=float, default=10.0)
    p.add_argument("--max-points", type=int, default=200)
    p.add_argument("--out", type=Path, help="the report folder (default tune-<model>-<time>)")
    p.add_argument("--instances", type=_ints, help="instance counts to consider (default 1..2x cores)")
    p.add_argument("--max-batch-sizes", type=_ints, help="max_batch_size values to consider (default 1..128)")
    p.add_argument("--dynamic-batching", choices=("both", "on", "off"), default="both")
    p.add_argument("--queue-delays-us", type=_ints, help="queue delays to consider (default from compute time)")
    p.add_argument("--no-preferred", action="store_true", help="do not try preferred batch sizes")
    p.add_argument("--isolation", choices=("both", "thread", "process"), default="both",
                   help="a Python model's execution modes to try (default both)")
    p.add_argument("--warmup-s", type=float, default=1.0)
    p.add_argument("--window-s", type=float, default=1.0)
    p.add_argument("--stability-percentage", type=float, default=10.0)
    p.add_argument("--max-windows", type=int, default=8)
    p.add_argument("--server-flag", action="append", default=[], help="a flag for the started server (repeatable)")
    return p


def space_from(args: argparse.Namespace, origin: Candidate, backend: str = "") -> Space:
    space = default_space(origin, os.cpu_count() or 1)
    dynamic = {"both": (True, False), "on": (True,), "off": (False,)}[args.dynamic_batching]
    batches = space.batch_sizes if args.max_batch_sizes is None or origin.max_batch_size == 0 else args.max_batch_sizes
    isolation = {"both": ("thread", "process"), "thread": ("thread",), "process": ("process",)}[args.isolation]
    return Space(instances=args.instances or space.instances, batch_sizes=tuple(b for b in batches if b > 0),
                 dynamic=dynamic, queue_delays_us=args.queue_delays_us, preferred=not args.no_preferred,
                 isolation=isolation if backend == "python" else ())


class Stopped(KeyboardInterrupt):
    """SIGTERM, handled as Ctrl-C: the report of what was measured, the started server stopped."""


def _stop(signum: int, frame: object) -> None:
    raise Stopped(signal.Signals(signum).name)


def main(argv: Sequence[str]) -> int:
    args = parser().parse_args(list(argv))
    # Ctrl-C must reach us even when started from a script that ignores SIGINT in background jobs
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _stop)
    if args.url is None and args.model_repository is None:
        parser().error("--model-repository is required unless --url is given")
    out = args.out or Path(f"tune-{args.model}-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        target = (Target.attach(args.url, args.protocol, args.model) if args.url else
                  Target.start(args.model_repository, args.model, args.protocol, out / "server.log", tuple(args.server_flag)))
    except TritonError as e:
        print(f"tune: {e.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    try:
        outcome = run(args, target, out)
    finally:
        target.close()
    print(report.table(outcome))
    print(f"report: {out / 'index.html'}" + (f"; wrote {outcome.tuned_path}" if outcome.tuned_path else ""))
    return 0 if outcome.chosen[0] is not None else 1


def run(args: argparse.Namespace, target: Target, out: Path) -> report.Outcome:
    base_json = target.config_json()
    base = config_writer.from_json(json.dumps(base_json), args.model)
    origin = config_writer.candidate_of(base)
    timing = Timing(args.warmup_s, args.window_s, max_windows=max(MIN_WINDOWS, args.max_windows),
                    stability_pct=args.stability_percentage)
    started = time.monotonic()
    deadline = started + args.max_minutes * 60
    outcome = report.Outcome(args.model, args.objective, args.latency_budget_ms, [])
    progress = Progress(deadline)
    search = Search(origin, space_from(args, origin, base.backend), args.concurrency, Measurer(target, base, base_json, timing),
                    objective=args.objective, budget_ms=args.latency_budget_ms, max_points=args.max_points,
                    out_of_time=lambda: time.monotonic() + timing.warmup_s + 3 * timing.window_s > deadline,
                    on_point=progress.step)
    progress.total = search.plan_size()
    try:
        search.run()
    except KeyboardInterrupt:
        outcome.interrupted = True
    except TritonError as e:  # the server stopped answering (a refused load is a failed point, not this)
        outcome.notes.append(f"the search stopped: {e.message}")
    progress.close()
    outcome.points, outcome.exhausted = search.points, search.exhausted
    outcome.baseline = pick([p for p in search.points if p.candidate == origin], args.objective, args.latency_budget_ms)[0]
    if not outcome.interrupted:
        _confirm(search.measure, origin, outcome)
    outcome.elapsed_s = time.monotonic() - started
    _finish(args, target, base, base_json, outcome)
    report.write(out, outcome)
    return outcome


def _confirm(measure: Callable[[Candidate, int], Point], origin: Candidate, outcome: report.Outcome) -> None:
    """Measure the shipped config and the search's best again, alternately, ``CONFIRM_ROUNDS`` times at
    the pick's concurrency: minutes apart, a busy host can move a figure more than a configuration does;
    back to back it cannot. The pick stands only if it wins these rounds (``Outcome.chosen``)."""
    searched, _ = outcome.searched
    if searched is None or searched.candidate == origin:
        return
    try:
        for _ in range(CONFIRM_ROUNDS):
            outcome.confirm += [measure(origin, searched.concurrency), measure(searched.candidate, searched.concurrency)]
    except KeyboardInterrupt:
        outcome.interrupted = True
    except TritonError as e:
        outcome.notes.append(f"the back-to-back measurement stopped: {e.message}")


def _finish(args: argparse.Namespace, target: Target, base: config_writer.ModelConfig, base_json: dict[str, object],
            outcome: report.Outcome) -> None:
    """Write ``tuned.pbtxt`` (and load the pick) where allowed; give an attached server its config back."""
    chosen, _ = outcome.chosen
    if chosen is not None:
        _tuned(args, base, chosen, outcome)
    if args.url is None:
        return  # the server started here stops with the run
    try:
        if args.apply and chosen is not None:
            target.load(config_writer.override_json(config_writer.apply(base, chosen.candidate)))
            outcome.notes.append("--apply: the pick is loaded on the server")
        else:
            target.restore(base_json)  # type: ignore[arg-type]
    except TritonError as e:
        outcome.notes.append(f"could not set the server's config back: {e.message}")


def _tuned(args: argparse.Namespace, base: config_writer.ModelConfig, chosen: Point, outcome: report.Outcome) -> None:
    model_dir = args.model_repository / args.model if args.model_repository else None
    original = config_writer.read_original(model_dir, args.model) if model_dir and (model_dir / "config.pbtxt").is_file() else base
    tuned = config_writer.apply(original, chosen.candidate)
    header = (f"written by triton-actor tune: {outcome.verdict()}\n"
              f"serve it with --model-config-name=tuned (Triton or triton-actor)")
    outcome.tuned_text = config_writer.render(tuned, header)
    if model_dir is not None and (args.url is None or args.apply):
        outcome.tuned_path = str(config_writer.write(model_dir, tuned, header))
