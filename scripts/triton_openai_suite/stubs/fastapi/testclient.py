"""``TestClient(app)`` of the shim: ``app`` is the base URL of a running triton_actor (``tests/utils.py``
of the shim makes it), and requests go there over HTTP with ``requests``, as the tests' calls read."""

import requests


class TestClient:
    __test__ = False  # not a test class

    def __init__(self, app, **_kwargs):
        self.base_url = str(app).rstrip("/")
        self.session = requests.Session()

    def request(self, method, path, **kwargs):
        kwargs.setdefault("timeout", 120)
        return self.session.request(method, self.base_url + path, **kwargs)

    def get(self, path, **kwargs):
        return self.request("GET", path, **kwargs)

    def post(self, path, **kwargs):
        return self.request("POST", path, **kwargs)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.session.close()
