"""What is host-wide when several worker processes serve one port set: the Host seam, this process's host handlers,
the clients' shared-memory regions and the metrics snapshot a host gathers."""
