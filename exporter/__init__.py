"""runwatch.exporter: the run's Prometheus metrics and the server of /metrics (exporter/ at the
top of the checkout).

Takes a trainer's record (runwatch.trainer.record), never the trainer itself: it pulls in no numpy
and no model.
"""
