"""The native lab, without Docker: `runwatch up | down | status | reload` (lab.py) and the
supervision of its processes, their configuration, PID files and logs (supervise.py and its
parts: state, render, seal, argv, processes, locks; `up` is up.py).

Must not import the drill or the backtest; the drill starts its labs through up.py.
"""
