"""The ModelActor: the versions of one model, loading them (warmup, validation) and the handles the routing table publishes."""
