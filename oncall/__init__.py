"""runwatch.oncall: the on-call pager, Alertmanager's webhook receiver with a durable page log
(oncall/ at the top of the checkout), one concern a module, in the order a page flows:
records.py (a payload, a page, an ack), prometheus.py (the rule in force), incidents.py,
page_log.py (the durable log), watchdog.py, metrics.py, app.py (the web app), server.py (it on
uvicorn); and its two commands, `runwatch pager` (pager.py) and `runwatch pager-serve`
(pager_serve.py).

Stands alone: it talks to the lab over HTTP and imports only runwatch.core's command
conventions, names and addresses, and the server stack it shares with the console.
"""
