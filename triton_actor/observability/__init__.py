"""Logs and traces: Triton's log line formats, the trace writer, and the log and trace settings clients change at run time."""
