"""What the server is told at start: tritonserver's flags parsed into Settings, read once and passed down."""
