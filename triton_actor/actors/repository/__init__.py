"""The RepositoryActor: the model repositories, the control mode, the routing table; POLL's watcher and the load order."""
