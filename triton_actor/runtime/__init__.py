"""How code runs: the actor kernel on gevent, the thread bridge to native threads, native locks and threads
(``threads``), replies and response channels, the fast-path switch, GC settling, hub errors, the hot path's
socket calls. Every layer may use it; it imports nothing above the core values. It alone imports
``threading`` / ``_thread``, calls ``monkey.get_original`` or touches gevent's internals
(``tests/unit/test_threads_in_runtime.py``)."""
