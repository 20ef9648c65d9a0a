"""Stand-in for Triton's frontend's ``api_restriction`` module: ``test_openai_restricted_apis.py`` imports
``RestrictedFeatures`` at its top to unit-test that class. Importing it lets the file's server tests run
against triton_actor; the class's own tests fail here, as they test Triton's code, not ours."""


class RestrictedFeatures:
    def __init__(self, *args, **kwargs):
        raise NotImplementedError("RestrictedFeatures is a class of Triton's OpenAI frontend, not of triton_actor")
