#!/usr/bin/env python3
"""Interoperability client for Capstan's sidecars.

Generates Python stubs from proto/router_sidecar.proto and proto/gw_sidecar.proto
with grpcio-tools (a gRPC stack nobody on this project wrote), builds each request
from KubeSlice field names, calls the servers and prints what came back.

Usage: client.py --proto-dir DIR --plan PLAN.json
PLAN.json: [{"target": "127.0.0.1:PORT", "service": "router.SliceRouterSidecarService",
             "method": "UpdateEcmpRoutes", "fields": {"remoteSliceGwNsmSubnet": "..."}}, ...]
Prints one JSON list: [{"request": HEX, "response": HEX or null, "code": "OK" | grpc.StatusCode name,
                        "details": STR}, ...]
"""

import argparse
import importlib
import json
import os
import sys
import tempfile

import grpc
from google.protobuf import empty_pb2
from grpc_tools import protoc

MODULES = {"router": "router_sidecar", "sidecar": "gw_sidecar"}


def generate(proto_dir, out_dir):
    import grpc_tools

    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    for name in MODULES.values():
        args = [
            "grpc_tools.protoc",
            f"-I{proto_dir}",
            f"-I{well_known}",
            f"--python_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            os.path.join(proto_dir, f"{name}.proto"),
        ]
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed for {name}.proto")
    sys.path.insert(0, out_dir)


def call(entry, channels):
    package, service = entry["service"].split(".", 1)
    module = MODULES[package]
    pb2 = importlib.import_module(f"{module}_pb2")
    pb2_grpc = importlib.import_module(f"{module}_pb2_grpc")
    method = pb2.DESCRIPTOR.services_by_name[service].methods_by_name[entry["method"]]
    if method.input_type.full_name == "google.protobuf.Empty":
        request_class = empty_pb2.Empty
    else:
        request_class = getattr(pb2, method.input_type.name)
    request = request_class(**entry["fields"])

    target = entry["target"]
    if target not in channels:
        channels[target] = grpc.insecure_channel(target)
    stub = getattr(pb2_grpc, f"{service}Stub")(channels[target])
    result = {"request": request.SerializeToString().hex()}
    try:
        response = getattr(stub, entry["method"])(request, timeout=10)
        result.update(response=response.SerializeToString().hex(), code="OK", details="")
    except grpc.RpcError as error:
        result.update(response=None, code=error.code().name, details=error.details() or "")
    return result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--proto-dir", required=True)
    parser.add_argument("--plan", required=True)
    args = parser.parse_args()
    with open(args.plan) as plan_file:
        plan = json.load(plan_file)
    with tempfile.TemporaryDirectory() as out_dir:
        generate(args.proto_dir, out_dir)
        channels = {}
        results = [call(entry, channels) for entry in plan]
        for channel in channels.values():
            channel.close()
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
