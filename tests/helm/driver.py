#!/usr/bin/env python3
"""Drives Helm's own Go library (the helm-sdkpy wheel) for the chart scenarios.

usage: driver.py lint CHART
       driver.py install|upgrade NAME NAMESPACE CHART VALUES_JSON   (KUBECONFIG from the environment)
       driver.py uninstall NAME NAMESPACE
       driver.py list NAMESPACE
Prints the result as JSON on stdout. A failed Helm action prints Helm's message on stderr and exits
1; exit 3 means the library itself is missing (the test decides whether that skips or fails).
"""
import asyncio
import json
import os
import sys

try:
    import helm_sdkpy as helm
    import yaml  # PyYAML, installed with the kubernetes client of .ci/requirements.txt
except Exception as error:  # noqa: BLE001 - any import failure means "not installed here"
    print(f"helm-sdkpy or PyYAML is not importable: {error}", file=sys.stderr)
    sys.exit(3)


def config(namespace):
    return helm.Configuration(namespace=namespace, kubeconfig=os.environ.get("KUBECONFIG"))


def main(argv):
    action, args = argv[0], argv[1:]
    if action == "lint":
        return asyncio.run(helm.Lint(config("default")).run(args[0]))
    if action in ("install", "upgrade"):
        name, namespace, chart, values = args
        values = json.loads(values)
        if action == "install":
            run = helm.Install(config(namespace)).run(
                name, chart, values=values, create_namespace=True, wait=False, timeout=120)
        else:
            run = helm.Upgrade(config(namespace)).run(
                name, chart, values=values, wait=False, timeout=120, reset_values=True)
        return asyncio.run(run)
    if action == "uninstall":
        return asyncio.run(helm.Uninstall(config(args[1])).run(args[0], wait=False, timeout=120))
    if action == "list":
        return asyncio.run(helm.List(config(args[0])).run(all=True))
    raise SystemExit(f"unknown action {action!r}")


if __name__ == "__main__":
    try:
        result = main(sys.argv[1:])
    except helm.HelmError as error:
        print(str(error), file=sys.stderr)
        sys.exit(1)
    if isinstance(result, dict) and "manifest" in result:
        # The rendered objects, parsed, so the Rust side needs no YAML parser; hooks included.
        docs = list(yaml.safe_load_all(result["manifest"] or ""))
        for hook in result.get("hooks") or []:
            docs.extend(yaml.safe_load_all(hook.get("manifest", "")))
        result["objects"] = [d for d in docs if d]
    json.dump(result, sys.stdout)
