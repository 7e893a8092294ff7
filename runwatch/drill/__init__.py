"""On-call drills: `runwatch drill`, `ack`, `diagnose` and `postmortem`, each in the module of its
name; the drill's record (record.py), the pages Prometheus confirms (confirm.py), Alertmanager's
route timings as in force (routes.py), the grade's par (coach.py), and the drill's sealed answer,
built in one place (answer.py).

answer.py is low in the house (the trainer's config and seal only): the trainer's command, the
cluster's launcher and the lab seal through it. The commands sit on top of the lab and the
readouts, and import none of each other.
"""
