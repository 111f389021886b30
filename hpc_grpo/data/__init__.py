"""Data sets and the tiny test model: GSM8K, code-generation problems, a locally built tiny Qwen2."""
