"""On-call drills: `runwatch drill | ack | diagnose | postmortem` (drill.py) and the drill's sealed
answer, built in one place (answer.py).

answer.py is low in the house (the trainer's config and seal only): the trainer's command, the
cluster's launcher and the lab seal through it. drill.py sits on top of the lab and the readouts.
"""
