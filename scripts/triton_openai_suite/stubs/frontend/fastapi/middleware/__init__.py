"""Stand-in for the package of Triton's OpenAI frontend, whose test files import its modules at the top."""
