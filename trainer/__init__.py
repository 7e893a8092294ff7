"""runwatch.trainer: the workshop's training run (trainer/ at the top of the checkout).

Softmax regression and its data (model), the typed config saved with each run (config), a run a
step at a time with its incident (run), the record of a step (record), the live run paced by the
lab clock (live), whole runs offline (offline) and batched (batch), and a cluster's ranks (rank,
parallel, faults, gpu).

Imports runwatch.core and, to publish a live run, runwatch.exporter; nothing above them.
"""
