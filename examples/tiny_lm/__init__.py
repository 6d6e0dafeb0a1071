"""The demo workload: a byte-level GPT trained on the Python standard library's sources."""
