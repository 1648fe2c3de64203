"""The model: its definition (transformer), loading (GGUF, Hugging Face), tokenizer and chat template."""
