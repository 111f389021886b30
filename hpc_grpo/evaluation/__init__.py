"""Evaluating a trained policy: the eval job's settings, export to an HF folder, lm-eval and HumanEval scoring."""
