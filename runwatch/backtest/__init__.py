"""`runwatch backtest` (backtest.py): every seed x incident trained offline, loaded into a
throwaway real Prometheus, each alert read on the live lab's grid and against the plate.

One module a stage, each importing only those before it (tests/test_layers.py):
rules.py -> plan.py -> data.py -> evaluate.py -> report.py, and backtest.py, the command, last.
Beside them: the plate's signatures (signatures.py), recording rules inlined as subqueries
(inline.py), remote write (remote_write.py), the cache (datacache.py), a sweep's variants of
one alert (variants.py) and the workbench's tables and plot (sweep.py).

Must not import the lab, the drill, the console or the pager: it runs its own Prometheus.
"""
