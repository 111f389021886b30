"""The logic of each CLI command that is more than a call: status, resume, report, watch, rehearse."""
