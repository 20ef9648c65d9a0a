"""How code runs: the actor kernel on gevent, the thread bridge to native threads, replies and response channels, the
fast-path switch, GC settling, hub errors. Every layer may use it; it imports nothing above the core values."""
