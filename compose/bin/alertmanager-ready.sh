#!/bin/sh
# Alertmanager's healthcheck in docker-compose.yml: its /-/ready asks for the lab's password
# (--web.config.file), which the credentials volume holds. busybox's wget, in Alertmanager's
# image, sends a URL's user and password as basic auth. The password is URL-safe base64.
exec wget -q -O /dev/null "http://runwatch:$(cat /credentials/alertmanager/password)@127.0.0.1:9093/-/ready"
