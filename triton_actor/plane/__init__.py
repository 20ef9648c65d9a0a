"""The calls layer between the front ends and the actors: the data plane, the calls Python models make (BLS, model
control) and their waits, the live status data."""
