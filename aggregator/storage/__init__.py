"""Storage: the Redis store, the embedded Redis server, capacity and retention."""
