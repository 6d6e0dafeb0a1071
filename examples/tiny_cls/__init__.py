"""A small classification workload: an MLP on seeded synthetic blobs (evald's classification task)."""
