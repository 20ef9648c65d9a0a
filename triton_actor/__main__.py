"""``python -m triton_actor --model-repository DIR --http-port P``."""

from triton_actor import bootstrap  # noqa: F401, I001 - must run before anything else imports gevent users

import sys

from triton_actor.cli import main

sys.exit(main())
