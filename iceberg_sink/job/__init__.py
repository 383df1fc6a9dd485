"""The job: what runs each checkpoint on the driver and keeps a stream going.

pipeline.py is one sink job's per-checkpoint flow (check the input, write, aggregate, persist,
commit), plan.py the plan of one table's checkpoint; routing.py runs one such job per table a routed
stream names; dead_letter.py writes refused rows to the dead-letter table in the same checkpoint;
idle.py commits checkpoints a catalog outage left pending while a stream has no new input. The stages it drives live in writer/,
committer/, table/ and topology/.
"""
