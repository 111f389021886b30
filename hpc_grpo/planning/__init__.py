"""Everything checked before a job is queued: layouts, batch rules, memory, schedule, disk, preflight."""
