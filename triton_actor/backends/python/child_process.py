"""One isolated Python model's process, seen from the server: started, read, reaped and stopped.

The process runs ``python -m triton_actor.backends.python.isolated_child`` (spawned, never a fork of
the gevent-patched server) with four pipes for frames (:mod:`.frame_pipe`), two each way: commands
(init, execute, finalize) go on one, read by the child's main thread itself, and their replies come
back on another, read by the instance's thread itself (no thread in between: a request costs four
thread and process wake-ups, not six); everything else (decoupled responses, logs, call answers,
cancellations) goes through the other two, read by a reader thread on each side. Its stdout and
stderr are two more pipes whose lines go to the server log (stdout at INFO, stderr at WARNING: a
crash's ``faulthandler`` traceback lands there). It gets a session of its own, so a Ctrl-C at the
terminal reaches the server, which then finalizes it, rather than killing it first.

Threads: :class:`ChildProcess` is created and stopped on the instance's native thread, which alone
sends :attr:`~ChildProcess.commands` and reads :attr:`~ChildProcess.replies`. Every other frame to the
process goes through :attr:`~ChildProcess.to_child`, one writer thread per process
(``runtime.threads.SerialWriter``) that writes the frames in the order they were submitted, from any
thread, the hub's included, which never waits for the pipe. One native reader thread
per process (``runtime.threads.start_native_thread``) reads the other frames and the output, calls
``on_message(message)`` for each frame in order (:meth:`ChildProcess.wait_delivered` lets the
instance's thread wait until a given number were handled: a reply then never overtakes what the
model sent before it) and, once the process is gone and reaped (no zombies), ``on_exit(text)`` last.
Owner: the :class:`~.isolated.IsolatedInstance` that started it. Failure: every way of dying ends in
``on_exit``, with the exit code or signal in words.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...runtime.threads import NativeCondition, NativeEvent, SerialWriter, native_sleep, start_native_thread
from .frame_pipe import FrameReader, FrameWriter

log = logging.getLogger(__name__)
_model_log = logging.getLogger("triton_actor.model")
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[3])  # the folder holding the triton_actor package
STUB_MODULE = "triton_actor.backends.python.isolated_child"
OUTPUT_DRAIN_S = 2.0  # after the frames end, how long the output may still trickle in (a grandchild may hold it)
REAP_WAIT_S = 5.0


def describe_exit(returncode: int) -> str:
    """``"exited with signal 11 (SIGSEGV)"`` / ``"exited with code 1"``."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "unknown signal"
        return f"exited with signal {-returncode} ({name})"
    return f"exited with code {returncode}"


class ChildProcess:
    """A started model process and its reader thread."""

    def __init__(self, name: str, on_message: Callable[[Any], None], on_exit: Callable[[str], None]) -> None:
        self.name = name
        self._on_message = on_message
        self._on_exit = on_exit
        self.exited = NativeEvent()  # set by the reader once the process is reaped
        self.exit_text: str | None = None
        self._delivered = 0  # frames of the child's async pipe handled so far (reader thread)
        self._progress = NativeCondition()
        pipes = [os.pipe() for _ in range(6)]  # commands, to child, replies, from child, stdout, stderr
        (cmd_r, cmd_w), (in_r, in_w), (reply_r, reply_w), (out_r, out_w), (so_r, so_w), (se_r, se_w) = pipes
        theirs = (cmd_r, in_r, reply_w, out_w, so_w, se_w)
        args = [sys.executable, "-m", STUB_MODULE, *map(str, theirs[:4]), str(logging.getLogger().getEffectiveLevel())]
        env = dict(os.environ, PYTHONUNBUFFERED="1",
                   PYTHONPATH=os.pathsep.join(p for p in (_PACKAGE_ROOT, os.environ.get("PYTHONPATH")) if p))
        try:
            self.proc = subprocess.Popen(args, pass_fds=theirs[:4], stdin=subprocess.DEVNULL, stdout=so_w,
                                         stderr=se_w, env=env, start_new_session=True)
        except BaseException:
            for fd in (cmd_w, in_w, reply_r, out_r, so_r, se_r):
                os.close(fd)
            raise
        finally:
            for fd in theirs:  # the child's ends: its copies are the only ones
                os.close(fd)
        self.pid = self.proc.pid
        self.commands = FrameWriter(cmd_w)  # the instance's thread only
        self.replies = FrameReader(reply_r)  # the instance's thread only
        inbox = FrameWriter(in_w)  # the writer's thread only
        self.to_child = SerialWriter(f"frames to model process {name}", inbox.send, inbox.close)  # any thread
        start_native_thread(self._read, FrameReader(out_r), so_r, se_r)

    # -- reader thread ----------------------------------------------------------------------------
    def _read(self, frames: FrameReader, out_fd: int, err_fd: int) -> None:
        outputs = {out_fd: _LineLogger(logging.INFO, self), err_fd: _LineLogger(logging.WARNING, self)}
        poller = select.poll()
        for fd in (frames.fd, out_fd, err_fd):
            poller.register(fd, select.POLLIN)
        open_fds = {frames.fd, out_fd, err_fd}
        try:
            while frames.fd in open_fds:
                for fd, _event in poller.poll():
                    if fd == frames.fd:
                        self._read_frames(frames, poller, open_fds)
                    else:
                        _read_output(fd, outputs[fd], poller, open_fds)
            while open_fds and (ready := poller.poll(OUTPUT_DRAIN_S * 1000)):
                for fd, _event in ready:
                    _read_output(fd, outputs[fd], poller, open_fds)
        except Exception:  # a bug of ours or a malformed frame: the process is not trusted any more
            log.exception("model process %s (pid %d): reading it failed; stopping it", self.name, self.pid)
            self.proc.kill()
        finally:
            for fd in (out_fd, err_fd):
                os.close(fd)
            frames.close()
            self._reap()

    def _read_frames(self, frames: FrameReader, poller: Any, open_fds: set[int]) -> None:
        messages = frames.read_available()
        if messages is None:
            poller.unregister(frames.fd)
            open_fds.discard(frames.fd)
            return
        for message in messages:
            self._on_message(message)
            with self._progress:
                self._delivered += 1
                self._progress.notify_all()

    def _reap(self) -> None:
        code = _poll_until(self.proc, REAP_WAIT_S)
        if code is None:  # it closed its pipes but lives on: it is no use any more
            self.proc.kill()
            code = self.proc.wait()  # a blocking waitpid (``os`` is not patched)
        self.to_child.close()
        text = f"the model's process {describe_exit(code)}"
        if code:
            log.error("model process %s (pid %d): %s", self.name, self.pid, text)
        self.exit_text = text
        self._on_exit(text)
        with self._progress:
            self.exited.set()
            self._progress.notify_all()

    # -- the instance's thread --------------------------------------------------------------------
    def wait_delivered(self, count: int) -> None:
        """Return once the reader handled the first ``count`` frames the child sent it (or it is gone)."""
        with self._progress:
            while self._delivered < count and not self.exited.is_set():
                self._progress.wait()

    def wait_exit_text(self) -> str:
        """After the replies pipe ended: how the process ended, once the reader reaped it."""
        self.exited.wait()
        return self.exit_text or "the model's process exited"

    def stop(self, grace_s: float) -> None:
        """Close its input (it exits at end of file), then SIGTERM, then SIGKILL, ``grace_s`` apart;
        return once the reader has reaped it and the writer's thread ended (its writes fail once the
        process is gone; a grandchild that kept the pipe open and reads nothing holds it up to ``grace_s``)."""
        self.commands.close()
        self.to_child.close()
        for escalate in (self.proc.terminate, self.proc.kill):
            if self.exited.wait(grace_s):
                break
            log.warning("model process %s (pid %d) did not exit within %.0f s: %s", self.name, self.pid, grace_s,
                        escalate.__name__)
            try:
                escalate()
            except ProcessLookupError:
                pass
        self.exited.wait()
        self.replies.close()
        if not self.to_child.stopped.wait(grace_s):
            log.warning("model process %s (pid %d): its pipe's writer did not stop within %.0f s", self.name,
                        self.pid, grace_s)


MAX_LINE = 64 * 1024  # bytes of one line of the model's output held before it is logged anyway


class _LineLogger:
    """The model process's stdout or stderr, line by line into the server log."""

    def __init__(self, level: int, child: ChildProcess) -> None:
        self.level = level
        self.child = child
        self.partial = b""

    def feed(self, data: bytes) -> None:
        """Emit each complete line (``\n``, or ``\r`` as progress bars end theirs); a line longer than
        :data:`MAX_LINE` is emitted in pieces of that size: the rest is kept, so what is held (and copied
        for each read) stays bounded whatever the model writes."""
        lines = (self.partial + data).replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
        rest = lines.pop()
        while len(rest) > MAX_LINE:
            lines.append(rest[:MAX_LINE])
            rest = rest[MAX_LINE:]
        self.partial = rest
        for line in lines:
            if line:
                self.emit(line)

    def emit(self, line: bytes) -> None:
        _model_log.log(self.level, "[%s pid %d] %s", self.child.name, self.child.pid,
                       line.decode("utf-8", "replace"))


def _poll_until(proc: subprocess.Popen[bytes], timeout_s: float) -> int | None:
    """``proc``'s exit code once it exited, None if it still runs after ``timeout_s``. (``Popen.wait``
    with a timeout sleeps through ``time.sleep``, which is gevent's here: it would start a hub on this
    native thread.)"""
    for _ in range(int(timeout_s / 0.01) + 1):
        code = proc.poll()
        if code is not None:
            return code
        native_sleep(0.01)
    return proc.poll()


def _read_output(fd: int, sink: _LineLogger, poller: Any, open_fds: set[int]) -> None:
    data = os.read(fd, 65536)
    if data:
        sink.feed(data)
        return
    if sink.partial:
        sink.emit(sink.partial)
        sink.partial = b""
    poller.unregister(fd)
    open_fds.discard(fd)
