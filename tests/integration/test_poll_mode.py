"""POLL mode as reconciliation, on real servers: added, removed, changed, broken and half-written models,
and a reload under load that must not fail a single request."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import gevent
import gevent.event
import tritonclient.http as httpclient

from .model_control import Hammer, add_tagged, answers, ask, gone, index, tagged, wait_for
from .server import IDENTITY_CONFIG
from .test_lifecycle import BAD_INIT_PY

POLL_SECS = 2.0
POLL = ("--model-control-mode=poll", f"--repository-poll-secs={POLL_SECS}")
# a change is loaded after it settles (SETTLE_S = 1 s) and the load itself: allow a poll period and margin
WITHIN = POLL_SECS + 8.0


def test_poll_picks_up_added_removed_and_changed_models(tmp_path: Path, start_server) -> None:
    model_a = add_tagged(tmp_path, "a", edition=1)
    server = start_server(tmp_path, flags=POLL)
    client = httpclient.InferenceServerClient(server.url)
    assert ask(client, "a") == 101

    add_tagged(tmp_path, "b", edition=2)
    wait_for(lambda: answers(client, "b", 102), WITHIN, "added model b to serve")
    (model_a / "1" / "model.py").write_text(tagged(3))
    wait_for(lambda: answers(client, "a", 103), WITHIN, "changed model a to serve its new code")
    shutil.rmtree(tmp_path / "b")
    wait_for(lambda: gone(client, "b"), WITHIN, "removed model b to be unloaded")
    wait_for(lambda: ("b", "1") not in index(client), WITHIN, "b to leave the index (as in Triton)")
    assert ask(client, "a") == 103


def test_failed_model_is_retried_when_its_files_change(tmp_path: Path, start_server) -> None:
    """Triton (https://github.com/triton-inference-server/server/issues/6534): a model that failed once was never polled again."""
    add_tagged(tmp_path, "a", edition=1)
    server = start_server(tmp_path, flags=POLL)
    client = httpclient.InferenceServerClient(server.url)
    broken = add_tagged(tmp_path, "c", edition=0)
    (broken / "1" / "model.py").write_text(BAD_INIT_PY)
    wait_for(lambda: index(client).get(("c", "1"), {}).get("state") == "UNAVAILABLE", WITHIN, "c to fail")
    assert "initialize failed on purpose" in index(client)[("c", "1")]["reason"]
    loads = server.log().count("poll: loading 'c'")
    (broken / "1" / "model.py").write_text(tagged(4))
    wait_for(lambda: answers(client, "c", 104), WITHIN, "the fixed model c to serve")
    assert server.log().count("poll: loading 'c'") == loads + 1


def test_a_folder_still_being_written_is_loaded_once_it_settled(tmp_path: Path, start_server) -> None:
    add_tagged(tmp_path, "a", edition=1)
    server = start_server(tmp_path, flags=POLL)
    client = httpclient.InferenceServerClient(server.url)
    model_dir = tmp_path / "slowcopy"
    (model_dir / "1").mkdir(parents=True)
    steps = [("config.pbtxt", IDENTITY_CONFIG), ("notes.txt", "a"), ("notes.txt", "ab"), ("notes.txt", "abc"),
             ("1/model.py", tagged(5))]
    for rel, text in steps:  # a slow copy: something changes every 0.4 s for 2 s
        (model_dir / rel).write_text(text)
        gevent.sleep(0.4)  # the writer's pace is what is tested, not a wait for the server
    wait_for(lambda: answers(client, "slowcopy", 105), WITHIN, "the copied model to serve")
    assert server.log().count("poll: loading 'slowcopy'") == 1, server.log()


def test_reload_under_load(tmp_path: Path, start_server) -> None:
    """Clients hammer the model while version 2 is copied in and version 1 removed: no request fails and
    the answers switch to version 2."""
    repo = tmp_path / "repo"
    model_dir = add_tagged(repo, "m", edition=1)
    staging = tmp_path / "staging"
    (staging / "2").mkdir(parents=True)
    (staging / "2" / "model.py").write_text(tagged(2))
    server = start_server(repo, flags=POLL)
    load = Hammer(server.url, "m")
    wait_for(lambda: len(load.answers) >= 50, WITHIN, "the load to be served by version 1")
    shutil.copytree(staging / "2", model_dir / "2")
    shutil.rmtree(model_dir / "1")
    landed = time.monotonic()
    wait_for(lambda: any(tag == 202 for _, tag in load.answers[-50:]), WITHIN, "version 2 to answer")
    client = httpclient.InferenceServerClient(server.url)
    # the load stays on while version 1 drains and unloads, and a while after
    wait_for(lambda: index(client)[("m", "1")].get("reason") == "unloaded", WITHIN, "version 1 to be unloaded")
    after = len(load.answers)
    wait_for(lambda: len(load.answers) >= after + 50, WITHIN, "answers after version 1 unloaded")
    load.stop()
    answers, failures = load.answers, load.failures
    first_new = min(t for t, tag in answers if tag == 202)
    last_old = max((t for t, tag in answers if tag == 101), default=landed)
    print(f"\nRELOAD-UNDER-LOAD sent={load.sent} failed={len(failures)} "
          f"first_v2_after={first_new - landed:.3f}s last_v1_after={last_old - landed:.3f}s")
    assert not failures, failures[:5]
    assert {tag for _, tag in answers} == {101, 202}
    # after the swap only requests already in flight (at most one per client) finish on version 1
    assert sum(1 for t, tag in answers if tag == 101 and t > first_new) <= load.clients


def test_the_watcher_alone_notices_changes(tmp_path: Path, start_server) -> None:
    """``--repository-poll-secs=0`` turns the periodic rescan off: only the watchdog nudge is left."""
    add_tagged(tmp_path, "a", edition=1)
    server = start_server(tmp_path, flags=("--model-control-mode=poll", "--repository-poll-secs=0"))
    client = httpclient.InferenceServerClient(server.url)
    add_tagged(tmp_path, "b", edition=2)
    took = wait_for(lambda: answers(client, "b", 102), WITHIN, "the watcher to bring model b in")
    assert took < 5.0


def test_broken_updates_under_load_keep_the_old_version_serving(tmp_path: Path, start_server) -> None:
    model_dir = add_tagged(tmp_path, "m", edition=1)
    server = start_server(tmp_path, flags=POLL)
    client = httpclient.InferenceServerClient(server.url)
    load = Hammer(server.url, "m")
    (model_dir / "2").mkdir()
    (model_dir / "2" / "model.py").write_text(BAD_INIT_PY)  # a new version whose initialize raises
    wait_for(lambda: "initialize failed on purpose" in index(client)[("m", "1")].get("reason", ""), WITHIN,
             "the failed update to show in the index")
    assert ("m", "2") not in index(client)
    (model_dir / "config.pbtxt").write_text("max_batch_size: [ nonsense")  # then a config that does not parse
    wait_for(lambda: "config.pbtxt" in index(client)[("m", "1")].get("reason", ""), WITHIN, "the bad config")
    load.stop()
    assert load.sent > 0 and not load.failures, load.failures[:5]
    assert {tag for _, tag in load.answers} == {101}
    assert index(client)[("m", "1")]["state"] == "READY" and client.is_server_ready()
