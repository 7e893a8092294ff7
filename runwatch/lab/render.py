"""The configuration a lab's Prometheus and Alertmanager read: the repository's files as the
native lab serves them (loopback addresses, the lab's password and token), its rules in force,
and the file_sd targets Prometheus scrapes. Those are the places where the native lab differs
from docker compose.

Not for checking the configuration: `runwatch check` (runwatch.prom.checks) does, with promtool
and amtool; this names only what stops it from rendering.
"""

from __future__ import annotations

import json
import re
import secrets
import shutil

from runwatch.core import credentials
from runwatch.core.bounded import (
    MAX_RULE_FILE_BYTES,
    BoundedReadError,
    load_yaml,
    no_aliases_loader,
    read_bytes,
    read_text,
)
from runwatch.core.command import UsageError
from runwatch.core.files import write_atomic
from runwatch.core.names import LOOPBACK, PORTS
from runwatch.lab.state import LabDir


def loopback(config: str, ports: dict[str, int] = PORTS) -> str:
    """A config file's compose addresses (`http://pager:9095`) as the native lab has them: every
    service on 127.0.0.1, at the port the lab gave it (by default, the same port)."""
    return re.sub(rf"//({'|'.join(map(re.escape, PORTS))}):\d+", lambda m: f"//{LOOPBACK}:{ports[m[1]]}", config)


class Configuration(LabDir):
    """A lab's rendered configuration, its rules in force and its file_sd targets."""

    def link_config(self) -> None:
        self.targets.mkdir(parents=True, exist_ok=True)
        self.render_alertmanager_config()
        self.render_prometheus_config()
        self.install_rules()

    def render_prometheus_config(self) -> None:
        """prometheus.yml as the repository has it, with the lab's Alertmanager password on the
        alerting and scrape configs that reach Alertmanager (runwatch.core.credentials)."""
        import yaml  # here: `runwatch status` and `ack` need no YAML

        source, link = self.layout.prometheus_yml, self.prometheus_dir / "prometheus.yml"
        try:
            config = load_yaml(source, "Prometheus's configuration")
        except (FileNotFoundError, BoundedReadError) as err:
            raise UsageError(f"{err}; see `runwatch check`") from None
        auth = {
            "basic_auth": {"username": credentials.USER, "password_file": str(credentials.password_file(self.state))}
        }
        if isinstance(config, dict):  # promtool names what else is wrong
            alerting = config.get("alerting") if isinstance(config.get("alerting"), dict) else {}
            to_am = alerting.get("alertmanagers") if isinstance(alerting.get("alertmanagers"), list) else []
            jobs = config.get("scrape_configs") if isinstance(config.get("scrape_configs"), list) else []
            to_am = [*to_am, *(j for j in jobs if isinstance(j, dict) and j.get("job_name") == "alertmanager")]
            for entry in (e for e in to_am if isinstance(e, dict)):
                entry.update(auth)
        header = (f"# {source}, as `runwatch up` serves it: with the lab's Alertmanager password.\n"
                  f"# Edit {source.name} there, not here.\n")  # fmt: skip
        if link.is_symlink():  # a lab started before the config was rendered
            link.unlink()
        write_atomic(link, header + yaml.safe_dump(config, sort_keys=False, width=120))

    # The rules Prometheus reads are a copy, made at `up` and at each reload: a reload whose
    # rules Prometheus cannot evaluate in time puts the copy in force before it back (issue 28).
    def install_rules(self) -> None:
        """Put a copy of the configuration's rule files in force (state/prometheus/rules); the
        ones in force before go to rules.previous, for restore_rules."""
        rules, previous = self.prometheus_dir / "rules", self.prometheus_dir / "rules.previous"
        staged = self.prometheus_dir / "rules.staged"
        shutil.rmtree(staged, ignore_errors=True)
        staged.mkdir(parents=True)
        for f in self.layout.rule_files():  # bounded: a rule file linked to /dev/zero (issue 40)
            try:
                (staged / f.name).write_bytes(read_bytes(f, "a rule file", MAX_RULE_FILE_BYTES))
            except BoundedReadError as err:
                shutil.rmtree(staged, ignore_errors=True)
                raise UsageError(f"{err}; see `runwatch check`") from None
        shutil.rmtree(previous, ignore_errors=True)
        if rules.is_symlink():  # a lab started before the rules were copied
            rules.unlink()
        elif rules.exists():
            rules.rename(previous)
        staged.rename(rules)

    def restore_rules(self) -> None:
        """Put back the rules in force before the last install_rules."""
        rules, previous = self.prometheus_dir / "rules", self.prometheus_dir / "rules.previous"
        if previous.is_dir():
            shutil.rmtree(rules, ignore_errors=True)
            previous.rename(rules)

    def render_alertmanager_config(self) -> None:
        """Alertmanager's config as the repository has it, with loopback addresses, and each
        webhook to the pager carrying the lab's token (pager.token, made here once), which the
        pager asks of every webhook: no other process on the machine can page the learner."""
        import yaml  # here: `runwatch status` and `ack` need no YAML

        self.alertmanager_yml.parent.mkdir(parents=True, exist_ok=True)
        credentials.ensure(self.state)  # Alertmanager's own password, for its --web.config.file
        if not self.pager_token.exists():
            write_atomic(self.pager_token, secrets.token_urlsafe(32) + "\n", mode=0o600)
        source = self.layout.alertmanager_yml
        try:
            text = read_text(source, "Alertmanager's configuration", MAX_RULE_FILE_BYTES)  # bounded (issue 40)
            config = yaml.load(loopback(text, self.ports), Loader=no_aliases_loader())  # noqa: S506 (a SafeLoader)
        except (FileNotFoundError, BoundedReadError) as err:
            raise UsageError(f"{err}; see `runwatch check`") from None
        except yaml.YAMLError as e:
            where = getattr(e, "problem_mark", None)
            line = f" line {where.line + 1}" if where is not None else ""
            problem = getattr(e, "problem", None) or e
            raise UsageError(f"{source}:{line}: not YAML ({problem}); see `runwatch check`") from None
        if not isinstance(config, dict):
            raise UsageError(f"{source}: not an Alertmanager configuration (a mapping); see `runwatch check`")
        pager = self.url("pager") + "/"
        receivers = config.get("receivers") if isinstance(config.get("receivers"), list) else []
        for receiver in (r for r in receivers if isinstance(r, dict)):  # amtool names what else is wrong
            hooks = receiver.get("webhook_configs") if isinstance(receiver.get("webhook_configs"), list) else []
            for hook in (h for h in hooks if isinstance(h, dict)):
                if str(hook.get("url", "")).startswith(pager):
                    auth = {"type": "Bearer", "credentials_file": str(self.pager_token)}
                    given = hook.get("http_config") if isinstance(hook.get("http_config"), dict) else {}
                    hook["http_config"] = {**given, "authorization": auth}
        header = (f"# {source}, as `runwatch up` serves it: compose's service names on loopback, and the\n"
                  f"# lab's token on each webhook to the pager. Edit {source.name} there, not here.\n")  # fmt: skip
        write_atomic(self.alertmanager_yml, header + yaml.safe_dump(config, sort_keys=False, width=120))

    def write_target(self, job_file: str, addresses: list[str]) -> None:
        """Write targets/<job_file>.json atomically: file_sd must never read half a file."""
        self.write_groups(job_file, [{"targets": addresses}])

    def write_groups(self, job_file: str, groups: list[dict]) -> None:
        """targets/<job_file>.json of file_sd groups, each with its targets and labels."""
        write_atomic(self.targets / f"{job_file}.json", json.dumps(groups) + "\n")

    def remove_target(self, job_file: str) -> None:
        (self.targets / f"{job_file}.json").unlink(missing_ok=True)
