"""The actors of the supervision tree, one package per level: repository → model → scheduling (the kernel is in runtime/)."""
