"""Reward functions verl and trl call: GSM8K (gsm8k), MATH's boxed answers (math_boxed) and sandboxed code
execution (code); registry names each one and how the engines load it."""
