"""The logic of each CLI command that is more than a call (status, resume, prune, eval, export, logs, watch, report,
rehearse, ...): the cli package parses, calls one of these and prints."""
