"""What a learner reads off a run: the provisioned dashboards' queries run as Grafana would
(dashboard_queries.py), the plate drawn from them (picture.py) in its colours (colours.py) and
`runwatch plate` (plate.py).

Reads Prometheus over HTTP; must not import the lab, the drill or the backtest.
"""
