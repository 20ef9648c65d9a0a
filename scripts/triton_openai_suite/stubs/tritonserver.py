"""Stand-in for Triton's in-process ``tritonserver`` module, which Triton's OpenAI tests import at the top of
some files (for ``tritonserver.ModelControlMode``); nothing of it runs against triton_actor."""

import enum


class ModelControlMode(enum.Enum):
    NONE = "none"
    POLL = "poll"
    EXPLICIT = "explicit"


class Server:
    def __init__(self, *args, **kwargs):
        raise RuntimeError("the shim serves triton_actor, not an in-process tritonserver")
