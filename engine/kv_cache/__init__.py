"""The paged KV cache: block manager and prefix cache."""
