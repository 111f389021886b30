"""From a RunSpec to queued jobs: rendering the scripts, submitit executors, the job callables."""
