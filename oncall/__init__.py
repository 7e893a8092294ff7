"""runwatch.oncall: the on-call pager, Alertmanager's webhook receiver with a durable page log, and
`runwatch pager` (oncall/ at the top of the checkout).

Stands alone: it talks to the lab over HTTP and imports only runwatch.core's command conventions.
"""
