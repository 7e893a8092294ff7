"""The Prometheus family as the lab runs it: find the binaries (tools), run promtool and amtool's
checks (checks) and a learner's edit's (edits), start a throwaway server and query its HTTP
API (server).

Imports only runwatch.core: the lab, the backtest, the readouts and the tests all build on it.
"""
