"""The on-call console: the run's plate, its pages and runbooks, acks and the drill's diagnosis,
in one web page at http://127.0.0.1:9096/. It stands alone and talks HTTP to Prometheus,
Alertmanager and the pager (see console/README.md)."""
