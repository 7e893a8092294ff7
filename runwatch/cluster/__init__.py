"""The cluster: `runwatch train --ranks N` live, N ranks under MPICH's mpiexec (launcher.py), their
Prometheus targets (targets.py) and `runwatch flight-recorder` (flight_recorder.py).

Must not import the lab, the drill or the backtest.
"""
