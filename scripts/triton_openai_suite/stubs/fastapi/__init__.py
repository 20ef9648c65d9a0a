"""Stand-in for FastAPI where it is not installed: Triton's OpenAI tests import ``fastapi.testclient.TestClient``."""
