"""Backends: what runs a model inside one instance's native thread, behind :mod:`.base`."""
