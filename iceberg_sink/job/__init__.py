"""The job: what runs each micro-batch on the driver and keeps a stream going.

road.py is the road of one micro-batch, every sink's, stage by stage (reading.py, refusal.py,
reduction.py, distributing.py, writing.py, staging.py, committing.py); pipeline.py (SinkJob, one
table) and routing.py (RoutedJob, the tables a stream's rows name) plan it; plan.py holds the plans;
binding.py binds a job to its table; pending.py commits a checkpoint or keeps it pending, then runs
the post-commit topology; dead_letter.py is the dead-letter table and the writer tasks' split;
idle.py commits checkpoints a catalog outage left pending while a stream has no new input.
"""
