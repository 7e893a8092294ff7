"""The native lab, without Docker: `runwatch up | down | status | reload`, each in the module
named after it; starting a lab (start.py) and the supervision of its processes, their
configuration, PID files and logs (supervise.py and its parts: state, render, seal, argv,
processes, locks).

Must not import the drill or the backtest; the drill starts its labs through start.py.
"""
