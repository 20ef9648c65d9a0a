"""``triton-actor tune``: the command line and one run, start to report.

Start the server (or attach with ``--url``), read the model's served config, search, then write: the
report folder always (and tell the server where it is, for its status page's link); ``configs/tuned.pbtxt`` beside ``config.pbtxt`` when the server was started here,
or with ``--url`` only when ``--apply`` is given (which also loads the pick); without ``--apply`` an
attached server gets its original config back. Ctrl-C stops the search and still writes the report of
the points measured.

An ensemble has no instances or batching of its own: each composing model is searched in turn (the load
generator sends to the ensemble, the statistics are the composing model's), each search starting with the
earlier models' picks loaded, in rounds until a round moves no pick (at most ``ENSEMBLE_PASSES``: a step
before the bottleneck gains nothing until the bottleneck is tuned); each composing model gets its
``configs/tuned.pbtxt``. Runs in the main thread; exit status 0 with a pick, 1 without one, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from ..backends.devices import gpu_count
from ..errors import TritonError
from . import config_writer, report
from .measure import MIN_WINDOWS, Measurer, Timing
from .points import OBJECTIVES, Candidate, Point, pick
from .progress import Progress
from .search import Search, Space, default_space, doubling
from .target import Target

CONFIRM_ROUNDS = 2  # back-to-back rounds of (shipped, pick) that decide whether the pick stands
# a first round whose ratio is this far from 1 decides alone: the rounds of one config moved by up to a
# quarter seconds apart on the busy 2-core host (docs/tune.md), so a closer one needs the second round
CLEAR_MARGIN = 0.3
# rounds over an ensemble's composing models: the first finds the bottleneck step (a step before it shows
# no gain while a later one limits the pipeline), the second lets the earlier steps follow; a third only
# when the second still moved one
ENSEMBLE_PASSES = 3


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
    p.add_argument("--request-rate", type=_ints, help="open loop instead: Poisson arrivals at these rates (requests/s)")
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
    p.add_argument("--workers", type=_ints, help="--workers values to try, a server restart each (default 1..cores; "
                   "only for a server started here)")
    p.add_argument("--warmup-s", type=float, default=0.5)
    p.add_argument("--window-s", type=float, default=0.5)
    p.add_argument("--stability-percentage", type=float, default=10.0,
                   help="a point ends when the 95%% confidence interval of its mean throughput (and mean latency) "
                   "is within this %% of it (default 10)")
    p.add_argument("--max-windows", type=int, default=8)
    p.add_argument("--server-flag", action="append", default=[], help="a flag for the started server (repeatable)")
    return p


def space_from(args: argparse.Namespace, origin: Candidate, backend: str = "", kinds: tuple[str, ...] = (),
               workers: bool = False) -> Space:
    """The values to try; ``kinds`` from :func:`instance_kinds`; ``workers``: whether the server may be
    restarted (started here, not an ensemble)."""
    cores = os.cpu_count() or 1
    space = default_space(origin, cores)
    dynamic = {"both": (True, False), "on": (True,), "off": (False,)}[args.dynamic_batching]
    batches = space.batch_sizes if args.max_batch_sizes is None or origin.max_batch_size == 0 else args.max_batch_sizes
    isolation = {"both": ("thread", "process"), "thread": ("thread",), "process": ("process",)}[args.isolation]
    counts = tuple(sorted(doubling(1, cores))) if args.workers is None else args.workers
    return Space(instances=args.instances or space.instances, batch_sizes=tuple(b for b in batches if b > 0),
                 dynamic=dynamic, queue_delays_us=args.queue_delays_us, preferred=not args.no_preferred,
                 isolation=isolation if backend == "python" else (), kinds=kinds,
                 workers=tuple(n for n in counts if n > 1) if workers else ())


def instance_kinds(served_kind: str, gpus: int, local: bool) -> tuple[tuple[str, ...], str]:
    """The instance kinds to try besides the served config's own, and a line for the report saying why
    (or why none). ``gpus``: the GPUs of this host (``backends.devices.gpu_count``); ``local``: whether
    the server runs on this host (one attached by URL elsewhere has devices we cannot see). A kind the
    model's runtime cannot run (the CPU wheel of onnxruntime on a GPU host) fails to load: a failed point,
    the search goes on."""
    if not local:
        return (), "instance kind: not tuned, the server is on another host (its devices are not visible here)"
    if gpus == 0:
        return (), "instance kind: not tuned, no GPU on this host (no /proc/driver/nvidia/gpus entry visible)"
    other = "KIND_CPU" if served_kind == "KIND_GPU" else "KIND_GPU"
    return (other,), f"instance kind: {other} tried besides the config's {served_kind or 'KIND_CPU'} ({gpus} GPU(s))"


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
    if args.url is not None and args.workers is not None and args.workers != (1,):
        parser().error("--workers restarts the server: only for a server started here, not with --url")
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
    timing = Timing(args.warmup_s, args.window_s, max_windows=max(MIN_WINDOWS, args.max_windows),
                    stability_pct=args.stability_percentage)
    started = time.monotonic()
    deadline = started + args.max_minutes * 60
    outcome = report.Outcome(args.model, args.objective, args.latency_budget_ms, [])
    ensemble = base.platform == "ensemble"
    originals = _composing(target, base) if ensemble else {"": (base, base_json)}
    bases = {name: cfg for name, (cfg, _) in originals.items()}
    measure = Measurer(target, base, base_json, timing, open_loop=bool(args.request_rate), bases=bases)
    levels = args.request_rate or args.concurrency
    restartable = target.proc is not None and getattr(target, "restartable", False) and not ensemble
    if not restartable and args.workers != (1,):
        outcome.notes.append("workers: not tuned, " + ("an ensemble's composing models are searched in turn and a "
                             "restart would drop the earlier picks" if ensemble else "the server was not started here"))
    progress = Progress(deadline)
    floor = base.max_batch_size if ensemble else 0
    searches: list[Search] = []
    try:
        if ensemble:  # the shipped set first, alone: the baseline (the searches below change the other steps)
            first = next(iter(bases))
            searches.append(_search(args, target, bases[first], config_writer.candidate_of(bases[first], first), measure,
                                    levels, deadline, timing, False, outcome, progress, floor, fixed=True))
            searches[-1].run()
        for round_ in range(ENSEMBLE_PASSES if ensemble else 1):
            moved = False
            for name, cfg in bases.items():
                origin = outcome.ensemble.get(name) or config_writer.candidate_of(cfg, name)
                search = _search(args, target, cfg, origin, measure, levels, deadline, timing, restartable, outcome,
                                 progress, floor)
                if ensemble and round_ == 0:
                    _open_later_steps(measure, list(bases), name, search.space)
                searches.append(search)
                progress.total = max(progress.total, progress.done) + search.plan_size()
                search.run()
                if ensemble:  # the next model's search runs with this pick loaded
                    moved |= search.best != origin
                    outcome.ensemble[name] = search.best
                    measure.ensure(search.best)
            if not moved:
                break
    except KeyboardInterrupt:
        outcome.interrupted = True
    except TritonError as e:  # the server stopped answering (a refused load is a failed point, not this)
        outcome.notes.append(f"the search stopped: {e.message}")
    progress.close()
    if not searches:  # Ctrl-C before the first search was made
        searches.append(Search(config_writer.candidate_of(base), Space(instances=()), levels, measure))
    outcome.points = [p for s in searches for p in s.points]
    outcome.exhausted = any(s.exhausted for s in searches)
    origin = searches[0].origin
    outcome.baseline = pick([p for p in searches[0].points if p.candidate == origin], args.objective, args.latency_budget_ms)[0]
    if ensemble:
        last = [s for s in searches if s.points][-1:] or searches[:1]
        outcome.ensemble_best = last[0].scores.get(last[0].best, (None, False))
        outcome.notes.append("ensemble: each composing model searched in turn (in the first round with the steps "
                             "not searched yet given the most instances), the earlier picks loaded; no back-to-back "
                             "rounds (the shipped set would have to be loaded again)")
    elif not outcome.interrupted:
        _confirm(measure, origin, outcome)
    measure.close()
    outcome.elapsed_s = time.monotonic() - started
    _finish(args, target, base, base_json, outcome, originals)
    report.write(out, outcome)
    if args.url is not None:  # a server started here stops with the run: nothing would show the link
        outcome.notes.append(target.register_report(out))
        report.write(out, outcome)  # the note in the report too
    return outcome


def _composing(target: Target, ensemble: config_writer.ModelConfig) -> dict[str, tuple[config_writer.ModelConfig, dict[str, object]]]:
    """An ensemble's composing models' served configs (parsed, and as served), by name, in the order of
    its steps (each once)."""
    out = {}
    for name in dict.fromkeys(step.model_name for step in ensemble.ensemble_scheduling.step):
        served = target.config_of(name)
        out[name] = (config_writer.from_json(json.dumps(served), name), served)
    return out


def _search(args: argparse.Namespace, target: Target, cfg: config_writer.ModelConfig, origin: Candidate,
            measure: Measurer, levels: tuple[int, ...], deadline: float, timing: Timing, restartable: bool, outcome: report.Outcome,
            progress: Progress, floor: int = 0, fixed: bool = False) -> Search:
    """One model's search from ``origin``; ``fixed``: the origin alone (the ensemble's baseline)."""
    served_kind = mc_kind(cfg)
    kinds, why = instance_kinds(served_kind, gpu_count(), _local(target.url))
    if why not in outcome.notes:
        outcome.notes.append(why)
    space = space_from(args, origin, cfg.backend, kinds, workers=restartable)
    if floor:  # a composing model's max_batch_size below the ensemble's is refused (ensemble_utils.cc)
        space = replace(space, batch_sizes=tuple(b for b in space.batch_sizes if b >= floor))
    if fixed:
        space = Space(instances=())
    return Search(origin, space, levels, measure, objective=args.objective, budget_ms=args.latency_budget_ms,
                  max_points=args.max_points, on_point=progress.step,
                  out_of_time=lambda: time.monotonic() + timing.warmup_s + 3 * timing.window_s > deadline)


def _open_later_steps(measure: Measurer, names: list[str], searched: str, space: Space) -> None:
    """Before the first round's search of ``searched``: the steps after it get the most instances of the
    space, so its search sees its own limit and not theirs. A pipeline serves as fast as its slowest step;
    searched one step at a time behind a slower one, no step would gain and every climb would stop at once
    (two tied steps stay tied)."""
    most = max(space.instances, default=0)
    for name in names[names.index(searched) + 1:]:
        current = measure.loaded[name]
        if most > current.instances:
            measure.ensure(replace(current, instances=most))


def mc_kind(cfg: config_writer.ModelConfig) -> str:
    """The first instance group's kind as the served config names it ("" without a group)."""
    if not cfg.instance_group:
        return ""
    return config_writer.model_config.mc.ModelInstanceGroup.Kind.Name(cfg.instance_group[0].kind)


def _local(url: str) -> bool:
    host = url.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    return host in ("127.0.0.1", "localhost", "::1", "0.0.0.0", "")


def _confirm(measure: Callable[[Candidate, int], Point], origin: Candidate, outcome: report.Outcome) -> None:
    """Measure the shipped config and the search's best again, alternately, ``CONFIRM_ROUNDS`` times at
    the pick's load level: minutes apart, a busy host can move a figure more than a configuration does;
    back to back it cannot. The pick stands only if it wins these rounds (``Outcome.chosen``). A first
    round that gives one side ``CLEAR_MARGIN`` more is not repeated: a second would not turn it."""
    searched, _ = outcome.searched
    if searched is None or searched.candidate == origin:
        return
    try:
        for _ in range(CONFIRM_ROUNDS):
            level = round(searched.level)
            shipped, again = measure(origin, level), measure(searched.candidate, level)
            outcome.confirm += [shipped, again]
            if shipped.ok and again.ok and abs(_ratio(shipped, again, outcome.objective) - 1) > CLEAR_MARGIN:
                break
    except KeyboardInterrupt:
        outcome.interrupted = True
    except TritonError as e:
        outcome.notes.append(f"the back-to-back measurement stopped: {e.message}")


def _ratio(shipped: Point, again: Point, objective: str) -> float:
    """How much better ``again`` did than ``shipped`` on the objective (as ``Outcome.gain``)."""
    if objective == "latency":
        return shipped.p99_ms / again.p99_ms if again.p99_ms > 0 else 1.0
    return again.throughput / shipped.throughput


def _finish(args: argparse.Namespace, target: Target, base: config_writer.ModelConfig, base_json: dict[str, object],
            outcome: report.Outcome, originals: dict[str, tuple[config_writer.ModelConfig, dict[str, object]]]) -> None:
    """Write ``tuned.pbtxt`` (and load the pick) where allowed; give an attached server its config back.
    ``originals``: the tuned models' served configs by name ("" for the model itself; an ensemble's
    composing models otherwise)."""
    chosen, _ = outcome.chosen
    picks = dict(outcome.ensemble) if outcome.ensemble else ({"": chosen.candidate} if chosen is not None else {})
    for name, candidate in picks.items():
        _tuned(args, originals[name][0], candidate, outcome, name)
    if args.url is None:
        return  # the server started here stops with the run
    for name, (cfg, served) in originals.items():
        try:
            if args.apply and name in picks:
                target.load(config_writer.override_json(config_writer.apply(cfg, picks[name])), name)
            else:
                target.restore(served, name)  # type: ignore[arg-type]
        except TritonError as e:
            outcome.notes.append(f"could not set the server's config of {name or args.model} back: {e.message}")
    if args.apply and picks:
        outcome.notes.append("--apply: the pick is loaded on the server")


def _tuned(args: argparse.Namespace, base: config_writer.ModelConfig, candidate: Candidate, outcome: report.Outcome,
           name: str = "") -> None:
    model = name or args.model
    model_dir = args.model_repository / model if args.model_repository else None
    original = config_writer.read_original(model_dir, model) if model_dir and (model_dir / "config.pbtxt").is_file() else base
    tuned = config_writer.apply(original, candidate)
    header = (f"written by triton-actor tune ({args.model}): {outcome.verdict()}\n"
              f"serve it with --model-config-name=tuned (Triton or triton-actor)")
    if candidate.workers > 1:
        header += f"\nand triton-actor --workers {candidate.workers} (a server flag, not a config field)"
    text = config_writer.render(tuned, header)
    if name:
        outcome.tuned_texts[name] = text
    else:
        outcome.tuned_text = text
    if model_dir is not None and (args.url is None or args.apply):
        path = str(config_writer.write(model_dir, tuned, header))
        outcome.tuned_path = ", ".join(filter(None, [outcome.tuned_path, path]))
