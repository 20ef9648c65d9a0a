"""Model repositories on disk: layout rules and ``config.pbtxt`` handling."""
