"""Attention backends (torch, the C paged kernel, Triton), the batch layout they read, rotary embeddings."""
