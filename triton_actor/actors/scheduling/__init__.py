"""Per model version: the scheduler actors (default and dynamic batcher, sequence batcher, ensemble), their pure
policies, the instance pool and the model instances they run batches on."""
