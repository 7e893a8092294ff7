"""A CustomResourceDefinition's openAPIV3Schema as a JSON Schema that validates as the API server would.

    >>> schema = json_schema(yaml.safe_load(open("charts/crds/monitoring.coreos.com_podmonitors.yaml")))
    >>> jsonschema.Draft202012Validator(schema).is_valid({"apiVersion": "monitoring.coreos.com/v1", ...})

Kubernetes' structural schemas are OpenAPI v3.0, close to JSON Schema but for a few extensions:
- `x-kubernetes-int-or-string: true` is an integer or a string (a `oneOf`);
- `nullable: true` admits null;
- an object with `properties` and no `additionalProperties` prunes unknown fields, which
  kubectl's strict field validation rejects: here `additionalProperties: false`, unless
  `x-kubernetes-preserve-unknown-fields` keeps them;
- the other `x-kubernetes-*` keys (list types, CEL `x-kubernetes-validations`) are dropped: the
  CEL rules are not checked here;
- patterns are RE2's, and Python's `re` (which jsonschema uses) refuses a global flag such as
  `(?i)` anywhere but at the start: each becomes a scoped group `(?i:...)` over the rest of
  its own group, which is what it means in RE2.

Not for CRDs of several served versions at once: pick the version (`version=`).
"""

from __future__ import annotations

from typing import Any

import yaml

GLOBAL_FLAG = "(?i)"


def scoped_flags(pattern: str) -> str:
    """RE2's `(?i)` in mid-pattern as Python's scoped `(?i:...)`, to the end of its enclosing group.

    >>> scoped_flags("^(?i)(abort|warn)?$")
    '^(?i:(abort|warn)?$)'
    >>> scoped_flags("^((?i)jan|feb)$")
    '^((?i:jan|feb))$'
    """
    while (at := pattern.find(GLOBAL_FLAG)) >= 0:
        depth, end, escaped = 0, len(pattern), False
        for i in range(at + len(GLOBAL_FLAG), len(pattern)):
            c = pattern[i]
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == "(":
                depth += 1
            elif c == ")":
                if depth == 0:
                    end = i
                    break
                depth -= 1
        pattern = pattern[:at] + "(?i:" + pattern[at + len(GLOBAL_FLAG) : end] + ")" + pattern[end:]
    return pattern


def convert(node: Any) -> Any:
    """One openAPIV3Schema node (and everything under it) as JSON Schema."""
    if isinstance(node, list):
        return [convert(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: convert(v) for k, v in node.items() if not k.startswith("x-kubernetes-") and k != "nullable"}
    if node.get("x-kubernetes-int-or-string"):
        for key in ("anyOf", "type"):
            out.pop(key, None)
        out["oneOf"] = [{"type": "integer"}, {"type": "string"}]
    if "pattern" in out:
        out["pattern"] = scoped_flags(out["pattern"])
    if (
        out.get("type") == "object"
        and "properties" in out
        and "additionalProperties" not in out
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


def json_schema(crd: dict, version: str | None = None) -> dict:
    """The JSON Schema of a CRD's version (default: its storage version), apiVersion and kind fixed."""
    versions = crd["spec"]["versions"]
    chosen = next(v for v in versions if (v["name"] == version if version else v.get("storage")))
    schema = convert(chosen["schema"]["openAPIV3Schema"])
    group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
    schema["properties"]["apiVersion"] = {"const": f"{group}/{chosen['name']}"}
    schema["properties"]["kind"] = {"const": kind}
    schema["required"] = sorted({*schema.get("required", ()), "apiVersion", "kind", "metadata", "spec"})
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": f"{kind} {chosen['name']}", **schema}


class Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """YAML 1.1's safe loader, reading a bare `=` (an enum value in the CRDs) as the string it is."""


Loader.add_constructor("tag:yaml.org,2002:value", lambda loader, node: loader.construct_scalar(node))


def load_crd(text: str) -> dict:
    return yaml.load(text, Loader=Loader)  # noqa: S506 (a safe loader)
