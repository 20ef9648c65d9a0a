"""triton_actor: a pure-Python, Triton-compatible inference server on an actor core."""

__version__ = "0.1.0"
