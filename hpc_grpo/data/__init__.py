"""Data sets and the tiny test model: GSM8K, MATH, code-generation problems, a locally built tiny Qwen2."""
