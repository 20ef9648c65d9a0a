"""The actor core: kernel, thread bridge, and the repository / model / scheduler / instance actors."""
