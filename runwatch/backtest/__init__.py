"""`runwatch backtest` (backtest.py): every seed x incident trained offline, loaded into a
throwaway real Prometheus over remote write (remote_write.py), the alert queries evaluated with
their recording rules inlined (inline.py), cached between runs (datacache.py), and read against
the plate's signatures (signatures.py).

Must not import the lab, the drill, the console or the pager: it runs its own Prometheus.
"""
